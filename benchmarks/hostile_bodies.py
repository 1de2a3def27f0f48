#!/usr/bin/env python
"""Hostile bodies (issue 45): a million integers on every route, refused how fast, at what memory, and what a
stream of legitimate requests meanwhile sees; this tree beside another (`--code`, the code before the change).

Servers, as deployed: `dask scheduler --preload shoal.scheduler_plugins --shoal-gateway-port` (the embedded
gateway, on the scheduler's event loop) and a `shoal gateway` process in front of it, with one `dask worker`
serving a simulated model (`sim`: no compute, so what is measured is the gateway's path). For each server and
each tree:

- every hostile body of BODIES (each about 2-3 MB: a million integers where a route takes texts, documents,
  token ids or labels) is sent alone, one after another; its refusal time is from the first byte sent to the
  last byte of the answer, and the server process's resident memory is sampled every 10 ms (baseline before the
  body, peak while it is answered);
- meanwhile a stream of legitimate one-text requests (OpenAI shape, JSON) goes to the same server at --rate per
  second, open loop over kept-alive connections: each latency is counted from its scheduled send time, so a
  stall of the event loop shows in every request that waited behind it. Its p50/p99/max over the whole hostile
  phase are reported, beside the same stream's alone (--alone seconds before the first body): what the
  machine's load gives it without hostile bodies.

Last, in this process: how long the largest legal body of each shape holds the event loop in this tree's gateway
(decoding, limits, schema), best of 5.

Targets (issue 45): each body refused in under 50 ms, the memory flat, the stream's p99 under 100 ms; no legal
body's validation holding the loop more than a few milliseconds.

    flock /work/tools/.bench.lock .venv/bin/python benchmarks/hostile_bodies.py --code /tmp/gateway-before
    .venv/bin/python benchmarks/hostile_bodies.py --servers embedded --rounds 1   # this tree only, quicker

`--code PATH` is a checkout (e.g. `git worktree add /tmp/gateway-before <commit>`): its code runs in the
servers of the second column (its tree first on PYTHONPATH; shoal/__init__.py then maps its own folders).
Prints a Markdown table; writes JSON to benchmarks/results/hostile_bodies.json (or --json), with its headline
figures (docs/BENCHMARKS.md's opening table). `--report FILE` prints and writes an earlier run's result again.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import harness  # before Shoal's imports: the repository on sys.path, the workers' environment defaults
import msgpack
import psutil
import yaml

JSON = "application/json"
MSGPACK = "application/msgpack"
SIM = {"kind": "sim", "dim": 8, "max_seq_length": 64, "memory_bytes": 1000}
MILLION = [1] * 1_000_000


def _json(path: str, body: Any) -> tuple[str, str, bytes]:
    return path, JSON, json.dumps(body, separators=(",", ":")).encode()


def _pack(path: str, body: Any) -> tuple[str, str, bytes]:
    return path, MSGPACK, msgpack.packb(body)


# Every route, a million integers where it takes its inputs (the four, then the rest).
BODIES: dict[str, Callable[[], tuple[str, str, bytes]]] = {
    "Cohere /v2/rerank documents": lambda: _json("/v2/rerank", {"model": "sim", "query": "q", "documents": MILLION}),
    "MessagePack texts (/v1/encode)": lambda: _pack("/v1/encode/sim", {"texts": MILLION}),
    "OpenAI input=[1]*1e6+['x']": lambda: _json("/v1/embeddings", {"model": "sim", "input": [*MILLION, "x"]}),
    "OpenAI 700,000 one-id token arrays": lambda: _json("/v1/embeddings", {"model": "sim", "input": [[1]] * 700_000}),
    "Cohere /v1/rerank documents": lambda: _json("/v1/rerank", {"model": "sim", "query": "q", "documents": MILLION}),
    "JSON texts (/v1/encode)": lambda: _json("/v1/encode/sim", {"texts": MILLION}),
    "OpenAI one token array of 1e6 ids": lambda: _json("/v1/embeddings", {"model": "sim", "input": MILLION}),
    "OpenAI 1e6 ids, MessagePack": lambda: _pack("/v1/embeddings", {"model": "sim", "input": MILLION}),
    "native rerank documents": lambda: _pack("/v1/rerank/sim", {"query": "q", "documents": MILLION}),
    "int8 ranges of 500,000 dimensions": lambda: _pack(
        "/v1/encode/sim", {"texts": ["a"], "precision": "int8", "ranges": [[0] * 500_000, [1] * 500_000]}
    ),
    "Cohere /v2/embed texts": lambda: _json("/v2/embed", {"model": "sim", "texts": MILLION}),
    "MessagePack images (/v1/encode)": lambda: _pack("/v1/encode/sim", {"images": MILLION}),
    "sparse texts": lambda: _pack("/v1/sparse/sim", {"texts": MILLION}),
    "multivector texts": lambda: _pack("/v1/multivector/sim", {"texts": MILLION}),
    "classify labels": lambda: _pack("/v1/classify/sim", {"texts": ["a"], "labels": ["x"] * 1_000_000}),
    "extract texts": lambda: _pack("/v1/extract/sim", {"texts": MILLION}),
}
LEGIT = json.dumps({"model": "sim", "input": "a legitimate query"}).encode()


def code_env(code: str | None, **extra: str) -> dict[str, str]:
    """The servers' environment: `code`'s tree first on PYTHONPATH when given, else this one's."""
    paths = [str(Path(code).resolve())] if code else []
    pythonpath = os.pathsep.join([*paths, str(harness.ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, "PYTHONPATH": pythonpath, **extra}


def _wait_listening(port: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status, _ = _request(port, "POST", "/v1/embeddings", LEGIT, JSON, timeout=30)
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"nothing answered on port {port}")


@contextmanager
def cluster(folder: Path, code: str | None) -> Iterator[dict[str, tuple[int, int]]]:
    """{"embedded": (port, pid of the scheduler), "process": (port, pid of the shoal gateway)}, all stopped after."""
    catalog, profile = folder / "catalog.yaml", folder / "profile.yaml"
    catalog.write_text(yaml.safe_dump({"models": {"sim": SIM}}))
    profile.write_text(yaml.safe_dump({"name": "bench", "device": "cpu", "workers": 1, "threads_per_worker": 1}))
    env = code_env(code, SHOAL_CATALOG=str(catalog))
    scheduler_file, port = folder / "scheduler.json", _free_port()
    procs: list[subprocess.Popen] = []

    def start(command: list[str]) -> subprocess.Popen:
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        procs.append(proc)
        return proc

    try:
        scheduler = start(
            [harness.venv_command("dask"), "scheduler", "--host", "127.0.0.1", "--port", "0"]
            + ["--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(scheduler_file)]
            + ["--preload", "shoal.scheduler_plugins", "--shoal-gateway-port", str(port)]
        )
        deadline = time.monotonic() + 120
        while not (scheduler_file.exists() and scheduler_file.stat().st_size):
            if time.monotonic() > deadline:
                raise RuntimeError("dask scheduler did not start")
            time.sleep(0.2)
        address = json.loads(scheduler_file.read_text())["address"]
        start(
            [harness.venv_command("dask"), "worker", address, "--nthreads", "1", "--nworkers", "1"]
            + ["--preload", "shoal.workers", "--shoal-profile", str(profile)]
        )
        gateway = start(
            [harness.venv_command("shoal"), "gateway", "--scheduler", address, "--catalog", str(catalog), "--port", "0"]
        )
        assert gateway.stderr is not None
        url = next(line for line in gateway.stderr if "gateway on" in line).split("gateway on ")[1].split()[0]
        threading.Thread(target=gateway.stderr.read, daemon=True).start()  # drained: a full pipe would stall it
        servers = {"embedded": (port, scheduler.pid), "process": (int(url.rsplit(":", 1)[1]), gateway.pid)}
        for served_port, _ in servers.values():
            _wait_listening(served_port)
        yield servers
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(port: int, method: str, path: str, body: bytes, media: str, timeout: float = 300) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request(method, path, body, {"Content-Type": media, "Accept": JSON})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


class MemoryPeak:
    """The resident memory of a process, sampled every 10 ms in a thread: its peak since `reset`."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak = self.baseline = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def reset(self) -> None:
        self.peak = self.baseline = self.process.memory_info().rss

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            try:
                self.peak = max(self.peak, self.process.memory_info().rss)
            except psutil.Error:
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


class LegitStream:
    """Open loop: one legitimate request every 1/rate s over kept-alive connections (a thread each, at most
    `connections` in flight); each latency from its scheduled time."""

    def __init__(self, port: int, rate: float, connections: int = 16) -> None:
        self.port, self.interval = port, 1 / rate
        self.latencies: list[tuple[float, float]] = []  # (scheduled time, latency)
        self.failures: list[str] = []
        self._due: list[float] = []
        self._lock = threading.Condition()
        self._stop = False
        self._threads = [threading.Thread(target=self._send, daemon=True) for _ in range(connections)]
        self._clock = threading.Thread(target=self._schedule, daemon=True)

    def __enter__(self) -> LegitStream:
        for thread in [*self._threads, self._clock]:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._stop = True
            self._lock.notify_all()
        for thread in [self._clock, *self._threads]:
            thread.join()

    def _schedule(self) -> None:
        due = time.perf_counter()
        while not self._stop:
            due += self.interval
            time.sleep(max(0.0, due - time.perf_counter()))
            with self._lock:
                self._due.append(due)
                self._lock.notify()

    def _send(self) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        while True:
            with self._lock:
                while not self._due and not self._stop:
                    self._lock.wait()
                if self._stop:
                    break
                due = self._due.pop(0)
            try:
                connection.request("POST", "/v1/embeddings", LEGIT, {"Content-Type": JSON})
                response = connection.getresponse()
                response.read()
                if response.status != 200:
                    self.failures.append(str(response.status))
            except (OSError, http.client.HTTPException) as exc:
                self.failures.append(type(exc).__name__)
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
                continue
            self.latencies.append((due, time.perf_counter() - due))
        connection.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _stream_figures(latencies: list[float]) -> dict[str, Any]:
    return {
        "requests": len(latencies),
        "p50_ms": round(percentile(latencies, 0.50) * 1000, 1),
        "p99_ms": round(percentile(latencies, 0.99) * 1000, 1),
        "max_ms": round(max(latencies) * 1000, 1) if latencies else None,
    }


def measure(
    port: int, pid: int, bodies: dict[str, tuple[str, str, bytes]], rate: float, rounds: int, alone: float
) -> dict[str, Any]:
    memory = MemoryPeak(pid)
    results: dict[str, Any] = {"bodies": {}}
    try:
        with LegitStream(port, rate) as stream:
            time.sleep(alone)  # the stream alone first: what this machine's load gives it without hostile bodies
            hostile_from = time.perf_counter()
            for name, (path, media, data) in bodies.items():
                times, growth, answers = [], [], []
                for _ in range(rounds):
                    memory.reset()
                    began = time.perf_counter()
                    status, answer = _request(port, "POST", path, data, media)
                    times.append(time.perf_counter() - began)
                    growth.append(memory.peak - memory.baseline)
                    answers.append(status)
                    message = json.loads(answer)["error"]["message"] if status >= 400 else ""
                results["bodies"][name] = {
                    "bytes": len(data),
                    "status": answers[-1],
                    "message": message[:160],
                    "refused_ms": round(statistics.median(times) * 1000, 1),
                    "refused_ms_max": round(max(times) * 1000, 1),
                    "memory_growth_mib": round(max(growth) / 2**20, 1),
                }
                print(f"  {name}: {results['bodies'][name]['refused_ms']} ms, {answers[-1]}", flush=True)
            time.sleep(1)
        during = [latency for due, latency in stream.latencies if due >= hostile_from]
        results["stream"] = {"rate": rate, "failures": len(stream.failures), **_stream_figures(during)}
        results["stream_alone"] = _stream_figures([latency for due, latency in stream.latencies if due < hostile_from])
        results["rss_after_mib"] = round(memory.process.memory_info().rss / 2**20, 1)
    finally:
        memory.close()
    return results


def legal_costs(rounds: int = 5) -> dict[str, dict[str, Any]]:
    """Milliseconds (best of `rounds`) that the largest legal body of each shape holds the event loop for in this
    tree's gateway: decoding within the bounds, then the limits and the schema. In this process, on one core."""
    from shoal.configs import GatewaySettings
    from shoal.scheduler_plugins.gateway import api_formats as api
    from shoal.scheduler_plugins.gateway import body_limits, wire

    limits = GatewaySettings()
    bounds = body_limits.decode_bounds(limits)
    text = "a legitimate text, of about eighty characters, with commas, colons: and [brackets]"
    shapes = {
        "OpenAI 2,048 texts (JSON)": (api.openai_request, {"model": "m", "input": [text] * 2048}, JSON),
        "OpenAI 2,048 token arrays, 299,008 ids (JSON)": (
            api.openai_request,
            {"model": "m", "input": [[1000 + i % 50_000 for i in range(146)]] * 2048},
            JSON,
        ),
        "Cohere 10,000 documents as maps (JSON)": (
            lambda body, limits: api.cohere_call(body, limits),
            {"model": "m", "query": "q", "documents": [{"text": text, "id": str(i)} for i in range(10_000)]},
            JSON,
        ),
        "native encode 2,048 texts (MessagePack)": (
            lambda body, limits: api.encode_call("m", body, limits),
            {"texts": [text] * 2048},
            MSGPACK,
        ),
        "native rerank 10,000 documents (MessagePack)": (
            lambda body, limits: api.score_call("m", body, limits),
            {"query": "q", "documents": [text] * 10_000},
            MSGPACK,
        ),
    }
    costs = {}
    for name, (call, body, media) in shapes.items():
        data = json.dumps(body).encode() if media == JSON else msgpack.packb(body)
        decoding = checking = float("inf")
        for _ in range(rounds):
            began = time.perf_counter()
            decoded = wire.decode(data, media, bounds)
            decoded_at = time.perf_counter()
            call(decoded, limits)
            decoding = min(decoding, decoded_at - began)
            checking = min(checking, time.perf_counter() - decoded_at)
        costs[name] = {
            "bytes": len(data),
            "decode_ms": round(decoding * 1000, 2),
            "checks_ms": round(checking * 1000, 2),
        }
    return costs


def figures(result: dict[str, Any]) -> list[harness.Figure]:
    """The headline figures: per tree and server, the slowest refusal, the largest memory growth, the stream's p99."""
    found = []
    for run_name, run in result["runs"].items():
        bodies = run["bodies"].values()
        slowest = max(body["refused_ms"] for body in bodies)
        growth = max(body["memory_growth_mib"] for body in bodies)
        p99 = run["stream"]["p99_ms"]
        after = not run_name.startswith("before")
        found += [
            harness.Figure(
                f"{run_name}: slowest refusal of {len(run['bodies'])} bodies",
                slowest,
                "ms",
                "< 50 ms" if after else "",
                slowest < 50 if after else None,
            ),
            harness.Figure(
                f"{run_name}: largest memory growth",
                growth,
                "MiB",
                "flat" if after else "",
                growth < 64 if after else None,
            ),
            harness.Figure(
                f"{run_name}: legitimate stream p99",
                p99,
                "ms",
                "< 100 ms" if after else "",
                p99 < 100 if after else None,
            ),
        ]
        if "stream_alone" in run:  # what the machine's load gave the same stream without hostile bodies
            found.append(harness.Figure(f"{run_name}: the stream's p99 alone", run["stream_alone"]["p99_ms"], "ms"))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--code", default=None, help="another checkout, measured beside this tree (the code before)")
    parser.add_argument("--servers", default="embedded,process", help="embedded (in the Dask scheduler), process")
    parser.add_argument("--rate", type=float, default=20.0, help="legitimate requests per second, open loop")
    parser.add_argument("--rounds", type=int, default=3, help="sends of each hostile body (the median is reported)")
    parser.add_argument("--alone", type=float, default=10.0, help="seconds of the stream alone, before the bodies")
    parser.add_argument("--bodies", default=None, help="comma-separated names of BODIES (default: all)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--report", default=None, help="a result file: print its report, write it with its figures")
    args = parser.parse_args()
    if args.report:
        earlier = json.loads(Path(args.report).read_text())
        harness.write_result("hostile_bodies", earlier, args.json, figures(earlier))
        print(report(earlier, list(next(iter(earlier["runs"].values()))["bodies"])))
        return
    names = args.bodies.split(",") if args.bodies else list(BODIES)
    bodies = {name: BODIES[name]() for name in names}
    trees = {"this tree": None, **({"before": args.code} if args.code else {})}
    result: dict[str, Any] = {"conditions": harness.conditions(load_before=harness.load_average()), "runs": {}}
    for tree, code in trees.items():
        with tempfile.TemporaryDirectory() as folder, cluster(Path(folder), code) as servers:
            for server in args.servers.split(","):
                port, pid = servers[server]
                print(f"{tree}, {server} gateway (load {harness.load_average()}):", flush=True)
                run = measure(port, pid, bodies, args.rate, args.rounds if code is None else 1, args.alone)
                run["load"] = harness.load_average()
                result["runs"][f"{tree} / {server}"] = run
    result["legal_bodies"] = legal_costs()
    result["conditions"]["load_after"] = harness.load_average()
    harness.write_result("hostile_bodies", result, args.json, figures(result))
    print(report(result, names))


def report(result: dict[str, Any], names: list[str]) -> str:
    runs = result["runs"]
    columns = ["body"] + [f"{run}: ms, MiB" for run in runs]
    rows = [
        [name]
        + [
            f"{r['bodies'][name]['refused_ms']} ms ({r['bodies'][name]['status']}), +{r['bodies'][name]['memory_growth_mib']}"
            for r in runs.values()
        ]
        for name in names
    ]
    rows.append(
        ["legitimate stream p50 / p99 / max (ms)"]
        + [
            f"{r['stream']['p50_ms']} / {r['stream']['p99_ms']} / {r['stream']['max_ms']} ({r['stream']['failures']} failed)"
            for r in runs.values()
        ]
    )
    rows.append(
        ["the same stream alone, before: p50 / p99 / max (ms)"]
        + [
            f"{r['stream_alone']['p50_ms']} / {r['stream_alone']['p99_ms']} / {r['stream_alone']['max_ms']}"
            if "stream_alone" in r
            else ""
            for r in runs.values()
        ]
    )
    rows.append(["load (1 min)"] + [str(r["load"]) for r in runs.values()])
    legal = harness.markdown_table(
        ["largest legal body (this tree)", "bytes", "decoding ms", "limits and schema ms"],
        [[name, c["bytes"], c["decode_ms"], c["checks_ms"]] for name, c in result.get("legal_bodies", {}).items()],
    )
    return "\n".join([*harness.markdown_table(columns, rows), "", *legal])


if __name__ == "__main__":
    main()
