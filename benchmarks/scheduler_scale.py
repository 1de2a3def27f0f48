"""The central queue at cluster scale: scheduler cost per batch item and per online request.

(a) The plugin alone: ``PullQueue`` on a stand-in scheduler object (no
    comms), driven by simulated workers in one event loop. Each worker pulls
    with room 2, keeps an LRU of 3 models, and keeps one online pull waiting,
    as real workers do; its "compute" is instant, or sleeps ``--compute-ms``
    per item (items leased but not started then wait behind it, and idle
    workers search them for one to take back). Every CPU second spent is
    the queue's (plus the stand-in workers' few lines per item, counted in
    the figure: it is conservative). For workers x models in a grid:
    CPU us per batch item and per online request, pull-reply p50/p99 (a
    pull that finds work never suspends, so its wall time is its CPU time),
    and the items/s and requests/s one core sustains (1 / CPU per event).
(b) A real ``dask scheduler`` process with simulated workers (``sim``
    models, ``sim`` operation: no Parquet) in one other process, over TCP:
    the scheduler process's CPU per item, comms included.
(c) Online requests/s through the embedded gateway of ``shoal serve``, and
    through 1 and 2 ``shoal gateway`` processes against one scheduler, with
    the same load generator (its CPU reported beside).

Run ``--code PATH`` to drive another checkout's plugin in (a) (for example
the code before the scale rework, from ``git worktree add``), side by side.

    .venv/bin/python benchmarks/scheduler_scale.py --parts a,b,c --plot docs/scheduler_scale.png --before OLD.json
    .venv/bin/python benchmarks/scheduler_scale.py --parts a --code /tmp/oldtree --workers 16,128,1024 --models 100 --json OLD.json
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

import harness  # before Shoal's imports: the repository on sys.path, the workers' environment defaults
from harness import ProcessClock

# -- (a) the plugin alone ------------------------------------------------------------------


class StandInScheduler:
    def __init__(self, workers: list[str]) -> None:
        self.workers = {w: type("State", (), {"resources": {}})() for w in workers}
        self.handlers: dict = {}
        self.stream_handlers: dict = {}
        self.stream_comms: dict = {}
        self.extensions: dict = {}
        self.periodic_callbacks: dict = {}


class SimWorker:
    """A worker's pull loop without the model: pulls with room 2, an LRU of 3 models, one online pull waiting.

    `compute`: seconds each batch item takes, slept between its start and its ack.
    """

    def __init__(self, plugin, address: str, models: list[str], pull_timeout: float, compute: float = 0.0) -> None:
        self.plugin = plugin
        self.address = address
        self.pull_timeout = pull_timeout
        self.compute = compute
        self.lru: OrderedDict[str, None] = OrderedDict((m, None) for m in models)
        self.done = 0
        self.pulls = 0
        self.pull_seconds: list[float] = []
        self.stop = False  # the online loop's
        self.batch_stop = False

    def hold(self, model: str) -> None:
        self.lru[model] = None
        self.lru.move_to_end(model)
        while len(self.lru) > 3:
            self.lru.popitem(last=False)

    async def batch(self) -> None:
        while not self.batch_stop:
            began = time.perf_counter()
            reply = await self.plugin.pull(
                self.address,
                held=list(self.lru),
                loaded=list(self.lru),
                room=2,
                in_hand=0,
                timeout=self.pull_timeout,
                budget=None,
                load_seconds={},
            )
            self.pulls += 1
            if reply["items"]:
                self.pull_seconds.append(time.perf_counter() - began)
            for message in reply["items"]:
                self.hold(message["model"])
                if still_held(self.plugin.start_item(self.address, message["id"])):
                    if self.compute:
                        await asyncio.sleep(self.compute)
                    self.plugin.ack(
                        self.address, message["id"], {"rows": 1024, "compute_seconds": self.compute or 0.05}
                    )
                    self.done += 1
            await asyncio.sleep(0)

    async def online(self) -> None:
        while not self.stop:
            reply = await self.plugin.online.pull(
                self.address, held=list(self.lru), loaded=list(self.lru), timeout=self.pull_timeout, busy=False
            )
            if reply["items"]:
                self.hold(reply["items"][0]["model"])
                self.plugin.online.ack_many(self.address, [[m["id"], {"n": 1}] for m in reply["items"]], 0.001)


def still_held(reply: bool | dict) -> bool:
    """`start_item`'s answer: a bool, or {"ok": bool} in checkouts before issue 23 (for --code)."""
    return reply if isinstance(reply, bool) else reply["ok"]


class Zipf:
    """Model names drawn with Zipf weights (the popular few and a long tail)."""

    def __init__(self, models: int, skew: float = 1.1) -> None:
        self.names = [f"m{i}" for i in range(models)]
        self.cum_weights = list(itertools.accumulate(1 / (i + 1) ** skew for i in range(models)))

    def draw(self, rng: random.Random, count: int = 1) -> list[str]:
        return rng.choices(self.names, cum_weights=self.cum_weights, k=count)


async def plugin_alone(
    workers: int, models: int, seconds: float, pull_timeout: float = 2.0, compute: float = 0.0, seed: int = 0
) -> dict:
    """One configuration: batch phase, idle phase, online phase.

    Waiting pulls renew every `pull_timeout` seconds (the profiles' default is
    2 s): a cost per second that grows with the number of workers, whatever
    the traffic. The idle phase measures it, and the per-event figures are
    given both as measured and net of it.

    CPU is `time.process_time()` (this process, to the nanosecond), not the
    harness's ProcessClock: that counts clock ticks, too coarse for the idle phase.
    """
    from configs import GatewaySettings
    from scheduler_plugins.pull_queue import PullQueue

    rng = random.Random(seed)
    names = [f"w{i}" for i in range(workers)]
    specs = {f"m{i}": {"name": f"m{i}", "kind": "sim", "load_seconds": 2.0} for i in range(models)}
    plugin = PullQueue(models=specs)
    await plugin.start(StandInScheduler(names))
    sims = [
        SimWorker(plugin, w, [f"m{(i * 3 + k) % models}" for k in range(3)], pull_timeout, compute)
        for i, w in enumerate(names)
    ]
    online_tasks = [asyncio.create_task(s.online()) for s in sims]
    await asyncio.sleep(0.05)

    # Batch: a backlog far larger than what workers take per pull, Zipf over the models.
    per_job = max(20_000, workers * 40)
    items = [
        {"key": str(i), "model": m, "op": "sim", "rows": 1024, "payload": {}}
        for i, m in enumerate(Zipf(models).draw(rng, per_job))
    ]
    plugin.submit("batch", items, {"lease_seconds": 600})
    batch_tasks = [asyncio.create_task(s.batch()) for s in sims]
    # Warm-up, not measured: each worker's first pulls (its view, its first models) cost once per worker.
    wall0 = time.perf_counter()
    while time.perf_counter() - wall0 < seconds and sum(s.done for s in sims) < 2 * workers:
        await asyncio.sleep(0.05)
    items0, pulls0 = sum(s.done for s in sims), sum(s.pulls for s in sims)
    touched0 = getattr(plugin.placement, "touched", None)  # counted since issue 23
    cpu0, wall0 = time.process_time(), time.perf_counter()
    while time.perf_counter() - wall0 < seconds and sum(s.done for s in sims) < per_job * 0.9:
        await asyncio.sleep(0.05)
    batch_cpu = time.process_time() - cpu0
    batch_items = sum(s.done for s in sims) - items0
    batch_pulls = sum(s.pulls for s in sims) - pulls0
    touched = plugin.placement.touched - touched0 if touched0 is not None else None
    for s in sims:
        s.batch_stop = True
    await asyncio.gather(*batch_tasks, return_exceptions=True)
    pulls = sorted(x for s in sims for x in s.pull_seconds)
    plugin.job_release("batch")

    # Idle: every worker's online pull waiting, renewed at its timeout; nothing else.
    await asyncio.sleep(pull_timeout)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.sleep(max(seconds, 2 * pull_timeout))
    idle_share = (time.process_time() - cpu0) / (time.perf_counter() - wall0)

    # Online: a closed loop of 64 requests in flight, Zipf over the models.
    settings = GatewaySettings(request_timeout_seconds=60, max_attempts=2)
    stop_at = time.perf_counter() + seconds
    answered = 0

    zipf = Zipf(models)

    async def client(client_seed: int) -> None:
        nonlocal answered
        crng = random.Random(client_seed)
        while time.perf_counter() < stop_at:
            model = zipf.draw(crng)[0]
            _, future = plugin.online.submit(model, "encode", {"texts": ["q"]}, 1, settings)
            await future
            answered += 1

    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(client(seed * 1000 + c) for c in range(64)))
    online_cpu = time.process_time() - cpu0
    online_wall = time.perf_counter() - wall0
    for s in sims:
        s.stop = True
    for t in online_tasks:
        t.cancel()
    await asyncio.gather(*online_tasks, return_exceptions=True)
    await plugin.close()
    per_item = batch_cpu / max(batch_items, 1)
    per_request = online_cpu / max(answered, 1)
    net_request = max(online_cpu - idle_share * online_wall, 0.0) / max(answered, 1)
    return {
        "workers": workers,
        "models": models,
        "pull_timeout_seconds": pull_timeout,
        "compute_ms": compute * 1e3,
        "idle_cpu_share": idle_share,
        "batch_items": batch_items,
        "batch_cpu_us_per_item": per_item * 1e6,
        "batch_items_per_cpu_second": 1 / per_item if batch_items else 0.0,
        "pull_reply_p50_us": statistics.median(pulls) * 1e6 if pulls else None,
        "pull_reply_p99_us": pulls[int(0.99 * (len(pulls) - 1))] * 1e6 if pulls else None,
        "search_entries_per_pull": touched / batch_pulls if touched is not None and batch_pulls else None,
        "online_requests": answered,
        "online_cpu_us_per_request": per_request * 1e6,
        "online_requests_per_cpu_second": 1 / per_request if answered else 0.0,
        "online_net_cpu_us_per_request": net_request * 1e6,
        "online_requests_per_second_wall": answered / online_wall,
    }


def part_a(args) -> list[dict]:
    if args.code:
        sys.path.insert(0, str(Path(args.code).resolve()))
    import scheduler_plugins

    print(f"(a) plugin alone, code from {Path(scheduler_plugins.__file__).parent.parent}", flush=True)
    rows = []
    for workers in args.workers:
        for models in args.models:
            row = asyncio.run(plugin_alone(workers, models, args.seconds, args.pull_timeout, args.compute_ms / 1e3))
            rows.append(row)
            touched = row["search_entries_per_pull"]
            print(
                f"  {workers:>5} workers x {models:>5} models: batch {row['batch_cpu_us_per_item']:6.1f} us/item "
                f"({row['batch_items_per_cpu_second']:6.0f} items/s"
                + (f", {touched:.1f} search entries/pull" if touched is not None else "")
                + "), pull p50/p99 "
                f"{row['pull_reply_p50_us'] or 0:5.1f}/{row['pull_reply_p99_us'] or 0:7.1f} us; online "
                f"{row['online_cpu_us_per_request']:6.1f} us/request ({row['online_requests_per_cpu_second']:6.0f}/s), "
                f"net of idle renewals {row['online_net_cpu_us_per_request']:6.1f} us; idle CPU {row['idle_cpu_share']:.1%}",
                flush=True,
            )
    return rows


# -- (b) a real scheduler, simulated workers over TCP ---------------------------------------------

SIM_MODEL = {"kind": "sim", "dim": 8, "max_seq_length": 64, "memory_bytes": 1000}


def write_catalog(folder: Path) -> Path:
    path = folder / "catalog.yaml"
    import yaml

    path.write_text(yaml.safe_dump({"models": {"simzero": SIM_MODEL}}))
    return path


def code_env(code: str | None, **extra: str) -> dict[str, str]:
    """The environment of (b)'s processes: `code`'s tree first on PYTHONPATH, when given."""
    paths = [str(Path(code).resolve())] if code else []
    pythonpath = os.pathsep.join([*paths, str(harness.ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, "PYTHONPATH": pythonpath, **extra}


def start_scheduler(folder: Path, catalog: Path, code: str | None = None) -> tuple[subprocess.Popen, str]:
    """`dask scheduler --preload scheduler_plugins` on loopback; its address once it is up."""
    scheduler_file = folder / "scheduler.json"
    scheduler_file.unlink(missing_ok=True)
    env = code_env(code, SHOAL_CATALOG=str(catalog))
    proc = subprocess.Popen(
        [
            harness.venv_command("dask"),
            "scheduler",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--dashboard-address",
            "127.0.0.1:0",
            "--scheduler-file",
            str(scheduler_file),
            "--preload",
            "scheduler_plugins",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not scheduler_file.exists() or not scheduler_file.read_text().strip():
        if time.monotonic() > deadline:
            raise TimeoutError("the scheduler did not start")
        time.sleep(0.1)
    time.sleep(0.2)
    return proc, json.loads(scheduler_file.read_text())["address"]


WORKERS_SCRIPT = """
import asyncio, sys
from distributed import Worker
async def main(address, count):
    workers = [Worker(address, nthreads=1, host="127.0.0.1", preload=["workers"], preload_argv=["--shoal-pin", "simzero"])
               for _ in range(count)]
    await asyncio.gather(*workers)
    await asyncio.Event().wait()
asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def start_workers(
    address: str, count: int, catalog: Path, profile: Path, processes: int = 1, code: str | None = None
) -> list[subprocess.Popen]:
    """`count` Dask workers with Shoal's plugin spread over `processes` processes: simulated models fit many
    on two cores, and each process's workers reach the scheduler over their own TCP connections."""
    env = code_env(code, SHOAL_CATALOG=str(catalog), SHOAL_PROFILE=str(profile))
    shares = [count // processes + (i < count % processes) for i in range(processes)]
    return [
        subprocess.Popen(
            [sys.executable, "-c", WORKERS_SCRIPT, address, str(share)],
            env=env,
            cwd=code,  # `python -c` puts its folder first on sys.path
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for share in shares
        if share
    ]


def write_profile(folder: Path) -> Path:
    import yaml

    path = folder / "scale.yaml"
    path.write_text(
        yaml.safe_dump(
            {"name": "scale", "device": "cpu", "prefetch": 2, "pull_timeout_seconds": 2.0, "threads_per_worker": 1}
        )
    )
    return path


def part_b(args, folder: Path) -> list[dict]:
    from distributed import Client

    from pipeline.cluster import pull_queue

    catalog, profile = write_catalog(folder), write_profile(folder)
    rows = []
    for count in args.real_workers:
        scheduler, address = start_scheduler(folder, catalog, args.code)
        workers = start_workers(address, count, catalog, profile, args.worker_processes, args.code)
        try:
            with Client(address, timeout=60) as client:
                client.wait_for_workers(count, timeout=300)
                plugin_workers = 0
                while plugin_workers < count:  # every worker's pull loop has reported
                    plugin_workers = len(client.sync(pull_queue(client).overview)["workers"])
                    time.sleep(0.2)
                items = [
                    {"key": str(i), "model": "simzero", "op": "sim", "rows": 1, "payload": {"tokens": [8]}}
                    for i in range(args.real_items)
                ]
                # Idle: Dask's heartbeats and the pulls' renewals, a cost per second, not per item.
                with ProcessClock(scheduler.pid) as idle:
                    time.sleep(3.0)
                idle_share = idle.share
                with ProcessClock(scheduler.pid) as busy:
                    client.sync(
                        pull_queue(client).submit,
                        job="scale",
                        items=items,
                        settings={"models": {"simzero": {"name": "simzero", **SIM_MODEL}}},
                    )
                    while not client.sync(pull_queue(client).job_status, job="scale")["complete"]:
                        time.sleep(0.05)
                wall, cpu = busy.seconds, busy.cpu_seconds
                client.sync(pull_queue(client).job_release, job="scale")
        finally:
            for proc in workers:
                proc.kill()
            scheduler.terminate()
            scheduler.wait(30)
        net = max(cpu - idle_share * wall, 0.0)
        row = {
            "workers": count,
            "items": args.real_items,
            "scheduler_cpu_us_per_item": cpu / args.real_items * 1e6,
            "scheduler_net_cpu_us_per_item": net / args.real_items * 1e6,
            "scheduler_idle_share": idle_share,
            "items_per_second_wall": args.real_items / wall,
            "scheduler_cpu_share": cpu / wall,
        }
        rows.append(row)
        print(
            f"  {count:>4} workers over TCP: scheduler {row['scheduler_cpu_us_per_item']:6.1f} us CPU per item "
            f"({row['scheduler_net_cpu_us_per_item']:6.1f} net of idle, {idle_share:.1%} of a core idle), "
            f"{row['items_per_second_wall']:5.0f} items/s, scheduler busy {row['scheduler_cpu_share']:.0%}",
            flush=True,
        )
    return rows


# -- (c) gateways -----------------------------------------------------------------------------

LOAD_SCRIPT = """
import asyncio, json, sys, time, resource
import aiohttp, msgpack
async def main(urls, seconds, concurrency):
    latencies, errors = [], 0
    body = msgpack.packb({"texts": ["a short query"]})
    headers = {"Content-Type": "application/msgpack", "Accept": "application/msgpack"}
    stop = time.perf_counter() + seconds
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def client(n):
            nonlocal errors
            url = urls[n % len(urls)] + "/v1/encode/simzero"
            while time.perf_counter() < stop:
                began = time.perf_counter()
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    if response.status != 200:
                        errors += 1
                        continue
                latencies.append(time.perf_counter() - began)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(client(n) for n in range(concurrency)))
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    latencies.sort()
    print(json.dumps({"requests": len(latencies), "errors": errors, "per_second": len(latencies) / wall,
                      "p50_ms": latencies[len(latencies) // 2] * 1e3, "p99_ms": latencies[int(len(latencies) * 0.99)] * 1e3,
                      "generator_cpu_share": cpu / wall}))
asyncio.run(main(sys.argv[1].split(","), float(sys.argv[2]), int(sys.argv[3])))
"""


def load(urls: list[str], seconds: float, concurrency: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", LOAD_SCRIPT, ",".join(urls), str(seconds), str(concurrency)],
        capture_output=True,
        text=True,
        timeout=seconds + 120,
        check=True,
    )
    return json.loads(out.stdout)


def start_gateway(address: str, catalog: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [
            harness.venv_command("shoal"),
            "gateway",
            "--scheduler",
            address,
            "--catalog",
            str(catalog),
            "--port",
            "0",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    for line in proc.stderr:
        if "gateway on" in line:
            return proc, line.split("gateway on ")[1].split()[0]
    raise RuntimeError("shoal gateway did not start")


def part_c(args, folder: Path) -> list[dict]:
    import urllib.request

    from distributed import Client

    from pipeline.cluster import pull_queue

    catalog, profile = write_catalog(folder), write_profile(folder)
    scheduler, address = start_scheduler(folder, catalog)
    workers = start_workers(address, 2, catalog, profile)
    gateways: list[subprocess.Popen] = []
    rows = []
    try:
        with Client(address, timeout=60) as client:
            client.wait_for_workers(2, timeout=120)
            embedded = client.sync(
                pull_queue(client).gateway_start,
                settings={"port": 0},
                models={"simzero": {"name": "simzero", **SIM_MODEL}},
            )["url"]
            urls = []
            for _ in range(2):
                proc, url = start_gateway(address, catalog)
                gateways.append(proc)
                urls.append(url)
            for url in [embedded, *urls]:
                while True:
                    try:
                        with urllib.request.urlopen(url + "/readyz", timeout=10) as response:
                            if response.status == 200:
                                break
                    except OSError:
                        time.sleep(0.2)
            setups = {"embedded gateway": [embedded], "1 shoal gateway": urls[:1], "2 shoal gateways": urls}
            for rep in range(args.reps):
                for name, targets in setups.items():
                    row = {"setup": name, "rep": rep, **load(targets, args.seconds, args.concurrency)}
                    rows.append(row)
                    print(
                        f"  {name:>18}: {row['per_second']:7.0f} req/s, p50 {row['p50_ms']:5.1f} ms, "
                        f"p99 {row['p99_ms']:6.1f} ms, errors {row['errors']}, "
                        f"load generator {row['generator_cpu_share']:.0%} of a core",
                        flush=True,
                    )
    finally:
        for proc in gateways:
            proc.terminate()
        for proc in workers:
            proc.kill()
        scheduler.terminate()
        scheduler.wait(30)
    return rows


def plot(rows: list[dict], before: list[dict], path: Path) -> None:
    """Scheduler CPU per batch item and per online request against workers (log x), per model count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, title in (
        (axes[0], "batch_cpu_us_per_item", "per batch item"),
        (axes[1], "online_net_cpu_us_per_request", "per online request (net of idle renewals)"),
    ):
        for models in sorted({r["models"] for r in rows}):
            points = sorted((r["workers"], r[key]) for r in rows if r["models"] == models)
            ax.plot(*zip(*points), marker="o", label=f"{models} models")
        old = sorted((r["workers"], r[key]) for r in before if r["models"] == 100)
        if old:
            ax.plot(*zip(*old), marker="x", linestyle="--", color="grey", label="100 models, before the rework")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("workers")
        ax.set_ylabel("scheduler CPU, us")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("One Shoal scheduler plugin on a stand-in scheduler (no comms), one core")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="a", help="comma-separated: a, b, c")
    parser.add_argument("--workers", default="16,128,1024,4096", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--models", default="24,100,1000", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--seconds", type=float, default=4.0, help="per phase and configuration")
    parser.add_argument("--pull-timeout", type=float, default=2.0, help="(a) the stand-in workers' long-poll timeout")
    parser.add_argument("--compute-ms", type=float, default=0.0, help="(a) each batch item's simulated compute")
    parser.add_argument("--code", default=None, help="a checkout whose plugins (a) and (b) run instead")
    parser.add_argument("--real-workers", default="8,32", type=lambda s: [int(x) for x in s.split(",")], help="(b)")
    parser.add_argument("--real-items", type=int, default=5000, help="(b) items per run")
    parser.add_argument("--worker-processes", type=int, default=4, help="(b) processes the workers are spread over")
    parser.add_argument("--concurrency", type=int, default=64, help="(c) requests in flight")
    parser.add_argument("--reps", type=int, default=2, help="(c) rounds over the three setups")
    parser.add_argument("--json", default=str(harness.result_path("scheduler_scale")))
    parser.add_argument("--plot", default=None, help="PNG of (a), with --before's rows beside")
    parser.add_argument("--before", default=None, help="a JSON of (a) from older code, for the plot")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    results: dict = {"conditions": harness.conditions()}
    if "a" in parts:
        results["a"] = part_a(args)
    with tempfile.TemporaryDirectory() as folder:
        if "b" in parts:
            print("(b) a dask scheduler process, simulated workers in one other process, over TCP", flush=True)
            results["b"] = part_b(args, Path(folder))
        if "c" in parts:
            print(
                f"(c) online requests/s, {args.concurrency} in flight, sim model with no compute, 2 workers", flush=True
            )
            results["c"] = part_c(args, Path(folder))
    print(f"wrote {harness.write_result('scheduler_scale', results, args.json)}")
    if args.plot and results.get("a"):
        before = json.loads(Path(args.before).read_text()).get("a", []) if args.before else []
        plot(results["a"], before, Path(args.plot))


if __name__ == "__main__":
    main()
