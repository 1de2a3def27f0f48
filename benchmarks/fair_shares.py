#!/usr/bin/env python
"""Fair shares (issue 45): one-text requests while large requests run, this tree's code beside another's.

`shoal serve --models minilm` (the shipped all-MiniLM-L6-v2, fp32 torch pinned, one worker owning the
machine's cores) under two loads at once, for --seconds after a warm-up:
- --big clients, each sending requests of 2,048 texts back to back (the gateway queues each as parts of the
  model's online batch, scheduler_plugins/gateway/request_parts.py);
- --small clients, each sending requests of one text back to back.
Reported per code: the one-text requests' latency (p50, p99, max; counted when sent within the measured
stretch), how many there were and how many failed (a 504 counts, at its latency), and the large requests'
texts per second and latency (they send until the stretch ends, then wait for their last answers); then one
2,048-text request alone, --alone times in a row (what the fair shares' shorter rounds cost a large request). --code TREE runs another checkout's code (for example the code before fair
shares, from `git worktree add`) with this harness, beside this tree's; the two alternate for --rounds.

    .venv/bin/python benchmarks/fair_shares.py --code /tmp/before            # 2 rounds of 60 s each
    .venv/bin/python benchmarks/fair_shares.py --seconds 20 --rounds 1      # this tree only, a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import harness  # before Shoal's imports: the repository on sys.path, the workers' environment defaults
import pyarrow.parquet as pq
import yaml
from harness import ROOT, load_average, markdown_table

DEFAULT_JSON = str(harness.result_path("fair_shares"))
BIG = 2048
SMALL_TARGET_P99 = 1.0  # seconds: issue 45's target for the one-text requests


def texts_of(words: int) -> list[str]:
    """The first `words` words of the demo corpus's first 2,048 rows."""
    shards = sorted((ROOT / "datasets" / "demo").glob("part-*.parquet"))
    rows = [t for shard in shards for t in pq.read_table(shard, columns=["text"]).column("text").to_pylist()]
    return [" ".join(t.split()[:words]) for t in rows[:BIG]]


def write_profile(directory: Path) -> Path:
    profile = directory / "bench-fair-shares.yaml"
    pinned = {"minilm": {"runtime": "torch", "dtype": "float32"}}  # no auto measurement beside the runs
    # A longer online lease than the default half second: a shared machine's other load can stall the worker's
    # loop past it, and a lapse's retry would be counted against whichever code ran then.
    gateway = {"online_lease_seconds": 5.0}
    body = {"name": "bench-fair-shares", "device": "cpu", "workers": 1, "runtimes": pinned, "gateway": gateway}
    profile.write_text(yaml.safe_dump(body))
    return profile


class Server:
    """`shoal serve` of `code`'s tree (this one by default) in a subprocess; stopped with SIGTERM."""

    def __init__(self, code: Path, profile: Path) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")])}
        command = [sys.executable, "-c", "from shoal.pipeline.cli import main; main()", "serve"]
        command += ["--profile", str(profile), "--port", "0", "--models", "minilm"]
        # `python -c` puts its working folder first on sys.path: the tree's own `shoal` package is found first.
        self.proc = subprocess.Popen(command, cwd=code, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.lines: list[str] = []
        stderr = self.proc.stderr
        assert stderr is not None
        threading.Thread(target=lambda: self.lines.extend(line.decode() for line in stderr), daemon=True).start()
        deadline = time.monotonic() + 300
        while not any("serving" in line for line in self.lines):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("shoal serve did not start:\n" + "".join(self.lines))
            time.sleep(0.1)
        found = re.search(r"on (http://\S+)", next(line for line in self.lines if "serving" in line))
        assert found, self.lines
        self.url = found.group(1)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


async def load(url: str, texts: list[str], big: int, small: int, warmup: float, seconds: float) -> dict[str, Any]:
    """Both loads at once; the one-text latencies of the requests sent within [warm-up, warm-up + seconds).

    The large clients send until the stretch ends and then wait for their last answers, the one-text clients
    going on meanwhile: the large requests' rate is every text they were answered over the time from the first
    send to the last answer, the whole run under both loads.
    """
    began = time.monotonic()
    start, stop = began + warmup, began + warmup + seconds
    small_latency: list[float] = []
    small_failed: list[int] = []
    big_latency: list[float] = []
    big_texts = 0
    big_running = big
    last_answer = began

    async def ask(session: aiohttp.ClientSession, inputs: list[str]) -> tuple[float, int]:
        sent = time.monotonic()
        body = {"model": "minilm", "input": inputs, "encoding_format": "base64"}
        async with session.post(f"{url}/v1/embeddings", json=body) as response:
            await response.read()
            return time.monotonic() - sent, response.status

    async def big_client(session: aiohttp.ClientSession) -> None:
        nonlocal big_texts, big_running, last_answer
        try:
            while time.monotonic() < stop:
                latency, status = await ask(session, texts)
                if status == 200:
                    big_texts += len(texts)
                    big_latency.append(latency)
                    last_answer = time.monotonic()
        finally:
            big_running -= 1

    async def small_client(session: aiohttp.ClientSession, n: int) -> None:
        i = 0
        while time.monotonic() < stop or big_running:
            sent = time.monotonic()
            latency, status = await ask(session, [texts[(n * 997 + i) % len(texts)]])
            i += 1
            if start <= sent < stop:
                small_latency.append(latency)
                if status != 200:
                    small_failed.append(status)

    timeout = aiohttp.ClientTimeout(total=600)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        await ask(session, texts[:8])  # the model loaded, its first batches run
        await asyncio.gather(
            *(big_client(session) for _ in range(big)), *(small_client(session, n) for n in range(small))
        )
    small_latency.sort()
    return {
        "small_requests": len(small_latency),
        "small_failed": len(small_failed),
        "small_statuses": sorted(set(small_failed)),
        "small_p50_seconds": statistics.median(small_latency) if small_latency else None,
        "small_p99_seconds": small_latency[int(0.99 * (len(small_latency) - 1))] if small_latency else None,
        "small_max_seconds": small_latency[-1] if small_latency else None,
        "big_requests": len(big_latency),
        "big_texts_per_second": big_texts / max(last_answer - began, 1e-9),
        "big_median_seconds": statistics.median(big_latency) if big_latency else None,
    }


def commit_of(code: Path) -> str:
    found = subprocess.run(["git", "-C", str(code), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return found.stdout.strip() or str(code)


async def alone(url: str, texts: list[str], times: int) -> list[float]:
    """One 2,048-text request at a time, `times` in a row, nothing else running: what fair shares cost it."""
    seconds = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        for _ in range(times):
            sent = time.monotonic()
            body = {"model": "minilm", "input": texts, "encoding_format": "base64"}
            async with session.post(f"{url}/v1/embeddings", json=body) as response:
                await response.read()
                response.raise_for_status()
            seconds.append(time.monotonic() - sent)
    return seconds


def one_run(code: Path, profile: Path, texts: list[str], args: argparse.Namespace) -> dict[str, Any]:
    server = Server(code, profile)
    try:
        load_before = load_average()
        result = asyncio.run(load(server.url, texts, args.big, args.small, args.warmup, args.seconds))
        result["big_alone_seconds"] = asyncio.run(alone(server.url, texts, args.alone))
    finally:
        exit_code = server.stop()
    return {
        "code": str(code),
        "commit": commit_of(code),
        **result,
        "load_before": load_before,
        "load_after": load_average(),
        "exit": exit_code,
    }


def figures(results: dict) -> list[harness.Figure]:
    """This tree's one-text p99 while large requests run (the worst of its runs), and its large requests' rate."""
    mine = [run for run in results["runs"] if run["code"] == str(ROOT)]
    p99 = max(run["small_p99_seconds"] for run in mine)
    texts_per_second = min(run["big_texts_per_second"] for run in mine)
    found = [
        harness.Figure(
            "one-text p99 beside 2,048-text requests", round(p99, 3), "s", "<= 1 s", p99 <= SMALL_TARGET_P99
        ),
        harness.Figure("2,048-text requests' texts per second meanwhile", round(texts_per_second), "texts/s"),
    ]
    others = [run for run in results["runs"] if run["code"] != str(ROOT) and run.get("big_alone_seconds")]
    if others and all(run.get("big_alone_seconds") for run in mine):
        ratio = min(map(min, (r["big_alone_seconds"] for r in others))) / min(
            map(min, (r["big_alone_seconds"] for r in mine))
        )
        found.append(harness.Figure("one 2,048-text request alone, --code's time / this tree's", round(ratio, 2), "x"))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--code", default=None, help="another checkout, run beside this tree's code")
    parser.add_argument("--big", type=int, default=4, help="clients sending 2,048-text requests back to back")
    parser.add_argument("--small", type=int, default=32, help="clients sending one-text requests back to back")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured, per run")
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--words", type=int, default=16, help="words per text (the demo corpus's rows, cut)")
    parser.add_argument("--alone", type=int, default=3, help="2,048-text requests alone after the load, in a row")
    parser.add_argument("--json", default=DEFAULT_JSON)
    args = parser.parse_args()
    texts = texts_of(args.words)
    codes = [ROOT, *([Path(args.code).resolve()] if args.code else [])]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        profile = write_profile(Path(tmp))
        for r in range(args.rounds):
            for code in codes if r % 2 == 0 else list(reversed(codes)):
                run = one_run(code, profile, texts, args)
                runs.append(run)
                print(
                    f"{run['commit']} ({code}): one-text p50/p99 "
                    f"{run['small_p50_seconds']:.3f}/{run['small_p99_seconds']:.3f} s, "
                    f"{run['small_failed']} failed of {run['small_requests']}; 2,048-text requests "
                    f"{run['big_texts_per_second']:.0f} texts/s (load {run['load_before']:.1f})",
                    flush=True,
                )
    columns = ["code", "round", "one-text p50 s", "p99 s", "max s", "failed", "2,048-text texts/s", "median s"]
    columns += ["one 2,048 alone s (best)", "load"]
    rows = [
        [
            run["commit"],
            i // len(codes) + 1,
            f"{run['small_p50_seconds']:.3f}",
            f"{run['small_p99_seconds']:.3f}",
            f"{run['small_max_seconds']:.3f}",
            f"{run['small_failed']}/{run['small_requests']}",
            f"{run['big_texts_per_second']:.0f}",
            f"{run['big_median_seconds']:.1f}" if run["big_median_seconds"] else "-",
            f"{min(run['big_alone_seconds']):.1f}" if run.get("big_alone_seconds") else "-",
            f"{run['load_before']:.1f}",
        ]
        for i, run in enumerate(runs)
    ]
    print("\n".join(markdown_table(columns, rows, right=tuple(columns[1:]))))
    results = {"conditions": harness.conditions(args=vars(args)), "target_p99_seconds": SMALL_TARGET_P99, "runs": runs}
    print(f"\nJSON: {harness.write_result('fair_shares', results, args.json, figures(results))}")


if __name__ == "__main__":
    main()
