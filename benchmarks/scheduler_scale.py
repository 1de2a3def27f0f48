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
    operation: no Parquet) spread over ``--worker-processes`` processes, over
    TCP: the scheduler's CPU per item, comms included, and the worker
    processes' CPU per item; both net of their idle CPU too. ``--batch-model
    minilm --item-rows 512`` runs the shipped MiniLM on the same items
    instead of the simulated model (no compute); their texts are runs of
    "x", a single token to MiniLM's tokenizer, so that is a floor.
(c) Online over real comms: the same scheduler and workers, a load generator
    in its own process keeping 1, 8 and 64 requests in flight (one text of
    ``--text-bytes`` each) through the embedded gateway (in the scheduler, as
    ``shoal serve`` runs it) and through ``shoal gateway`` processes.
    Requests/s, p50/p99, and CPU per request of the scheduler, the gateway
    processes, the workers and the generator over exactly the requests
    counted; net of each process's idle CPU too. ``--online-model minilm``
    serves the shipped MiniLM instead of the simulated model.

``--code PATH`` runs another checkout's code (for example the code before a
rework, from ``git worktree add``) in (a), and in (b) and (c)'s scheduler,
workers and gateways, side by side with the same harness.

    .venv/bin/python benchmarks/scheduler_scale.py --parts a,b,c --plot docs/scheduler_scale.png --before OLD.json
    .venv/bin/python benchmarks/scheduler_scale.py --parts a --code /tmp/oldtree --workers 16,128,1024 --models 100 --json OLD.json
    .venv/bin/python benchmarks/scheduler_scale.py --parts c --text-bytes 100,2000,16000 [--code /tmp/oldtree]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

import harness  # before Shoal's imports: the repository on sys.path, the workers' environment defaults
from harness import ProcessClock

from shoal.pipeline.tuning.meter import process_tree_cpu_seconds

if TYPE_CHECKING:  # the plugin code measured is --code's, imported when a part runs
    from shoal.scheduler_plugins.protocol import SubmittedItem

# -- (a) the plugin alone ------------------------------------------------------------------


class StandInScheduler:
    def __init__(self, workers: list[str]) -> None:
        self.workers = {w: type("State", (), {"resources": {}})() for w in workers}
        self.handlers: dict = {}
        self.stream_handlers: dict = {}
        self.stream_comms: dict = {}
        self.extensions: dict = {}
        self.periodic_callbacks: dict = {}
        self.plugins: dict = {}
        self.tasks: dict = {}

    # Dask's scaling methods, which the plugin replaces with its own (elastic.py) and keeps to call.
    def adaptive_target(self, target_duration: float | None = None) -> int:
        return 0

    def workers_to_close(self, **kwargs) -> list[str]:
        return []

    async def retire_workers(self, workers: list[str], **kwargs) -> dict:
        return {}


def parts(plugin):
    """(batch route, state) of a plugin: its parts since issue 46, the plugin itself in older checkouts (--code)."""
    return getattr(plugin, "batch", plugin), getattr(plugin, "state", plugin)


class SimWorker:
    """A worker's pull loop without the model: pulls with room 2, an LRU of 3 models, one online pull waiting.

    `compute`: seconds each batch item takes, slept between its start and its ack.
    """

    def __init__(self, plugin, address: str, models: list[str], pull_timeout: float, compute: float = 0.0) -> None:
        self.plugin = plugin
        self.route, self.state = parts(plugin)
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
            reply = await self.route.pull(
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
                start = getattr(self.state, "start_item", None) or self.state.start
                if still_held(start(self.address, message["id"])):
                    if self.compute:
                        await asyncio.sleep(self.compute)
                    self.state.ack(self.address, message["id"], {"rows": 1024, "compute_seconds": self.compute or 0.05})
                    self.done += 1
            await asyncio.sleep(0)

    async def online(self) -> None:
        while not self.stop:
            reply = await self.plugin.online.pull(
                self.address, held=list(self.lru), loaded=list(self.lru), timeout=self.pull_timeout, busy=False
            )
            if reply["items"]:
                self.hold(reply["items"][0]["model"])
                self.ack_online([m["id"] for m in reply["items"]])

    def ack_online(self, item_ids: list[str]) -> None:
        online = self.plugin.online
        if hasattr(online, "ack_many"):  # checkouts before issue 27 (for --code)
            online.ack_many(self.address, [[i, {"n": 1}] for i in item_ids], 0.001)
        elif hasattr(online, "ack_all"):  # since issue 46
            online.ack_all(self.address, [(item_id, {"tokens": 1}, 0.001) for item_id in item_ids])
        else:
            for item_id in item_ids:
                online.ack(self.address, item_id, {"tokens": 1}, 0.001)


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
    from shoal.configs import GatewaySettings, ModelSpec
    from shoal.scheduler_plugins.pull_queue import PullQueue

    rng = random.Random(seed)
    names = [f"w{i}" for i in range(workers)]
    specs = {
        f"m{i}": ModelSpec.model_validate({"name": f"m{i}", **SIM_MODEL, "load_seconds": 2.0}) for i in range(models)
    }
    plugin = PullQueue(models=specs)
    await plugin.start(StandInScheduler(names))
    route, state = parts(plugin)
    sims = [
        SimWorker(plugin, w, [f"m{(i * 3 + k) % models}" for k in range(3)], pull_timeout, compute)
        for i, w in enumerate(names)
    ]
    online_tasks = [asyncio.create_task(s.online()) for s in sims]
    await asyncio.sleep(0.05)

    # Batch: a backlog far larger than what workers take per pull, Zipf over the models.
    per_job = max(20_000, workers * 40)
    items: list[SubmittedItem] = [
        {"key": str(i), "model": m, "op": "sim", "rows": 1024, "payload": {}}
        for i, m in enumerate(Zipf(models).draw(rng, per_job))
    ]
    route.submit("batch", items, {"lease_seconds": 600})
    batch_tasks = [asyncio.create_task(s.batch()) for s in sims]
    # Warm-up, not measured: each worker's first pulls (its view, its first models) cost once per worker.
    wall0 = time.perf_counter()
    while time.perf_counter() - wall0 < seconds and sum(s.done for s in sims) < 2 * workers:
        await asyncio.sleep(0.05)
    items0, pulls0 = sum(s.done for s in sims), sum(s.pulls for s in sims)
    touched0 = getattr(state.placement, "touched", None)  # counted since issue 23
    cpu0, wall0 = time.process_time(), time.perf_counter()
    while time.perf_counter() - wall0 < seconds and sum(s.done for s in sims) < per_job * 0.9:
        await asyncio.sleep(0.05)
    batch_cpu = time.process_time() - cpu0
    batch_items = sum(s.done for s in sims) - items0
    batch_pulls = sum(s.pulls for s in sims) - pulls0
    touched = state.placement.touched - touched0 if touched0 is not None else None
    for s in sims:
        s.batch_stop = True
    await asyncio.gather(*batch_tasks, return_exceptions=True)
    pulls = sorted(x for s in sims for x in s.pull_seconds)
    route.job_release("batch")

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
            _, future = plugin.online.submit(model, "embed", {"texts": ["q"]}, 1, settings)
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


async def submit_job(client, job: str, items: list, options: dict) -> None:
    """``shoal_submit``: its third argument is `options` since issue 46, `settings` before (--code)."""
    try:
        await client.scheduler.shoal_submit(job=job, items=items, options=options)
    except TypeError:
        await client.scheduler.shoal_submit(job=job, items=items, settings=options)


def part_a(args) -> list[dict]:
    if args.code:  # Shoal is imported already (this tree's: the meter): forgotten, to be imported from --code
        sys.path.insert(0, str(Path(args.code).resolve()))
        for name in [name for name in sys.modules if name == "shoal" or name.startswith("shoal.")]:
            del sys.modules[name]
    from shoal import scheduler_plugins

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


def model_spec(name: str) -> dict:
    """`simzero` (simulated, no compute) or a model of the shipped catalog, e.g. `minilm`: the spec the queue
    gets, as a plain dict of the catalog's own keys (an older checkout under --code reads it too)."""
    if name == "simzero":
        return {"name": name, **SIM_MODEL}
    import yaml

    return {"name": name, **yaml.safe_load((harness.ROOT / "configs" / "catalog.yaml").read_text())["models"][name]}


def cpu_seconds(pids: list[int]) -> float:
    """CPU seconds so far of these processes and their children, together."""
    return sum(process_tree_cpu_seconds(pid) for pid in pids)


def code_env(code: str | None, **extra: str) -> dict[str, str]:
    """The environment of (b)'s processes: `code`'s tree first on PYTHONPATH, when given."""
    paths = [str(Path(code).resolve())] if code else []
    pythonpath = os.pathsep.join([*paths, str(harness.ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, "PYTHONPATH": pythonpath, **extra}


def start_scheduler(folder: Path, catalog: Path, code: str | None = None) -> tuple[subprocess.Popen, str]:
    """`dask scheduler --preload shoal.scheduler_plugins` on loopback; its address once it is up."""
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
            "shoal.scheduler_plugins",
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
async def main(address, count, model):
    workers = [Worker(address, nthreads=1, host="127.0.0.1", preload=["shoal.workers"], preload_argv=["--shoal-pin", model])
               for _ in range(count)]
    await asyncio.gather(*workers)
    await asyncio.Event().wait()
asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
"""


def start_workers(
    address: str,
    count: int,
    catalog: Path,
    profile: Path,
    processes: int = 1,
    code: str | None = None,
    model: str = "simzero",
) -> list[subprocess.Popen]:
    """`count` Dask workers with Shoal's plugin and `model` pinned, spread over `processes` processes: simulated
    models fit many on two cores, and each process's workers reach the scheduler over their own TCP connections."""
    env = code_env(code, SHOAL_CATALOG=str(catalog), SHOAL_PROFILE=str(profile))
    shares = [count // processes + (i < count % processes) for i in range(processes)]
    return [
        subprocess.Popen(
            [sys.executable, "-c", WORKERS_SCRIPT, address, str(share), model],
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


def profile_process(pid: int, prefix: str | None, workers: int) -> subprocess.Popen | None:
    """py-spy sampling `pid` (raw collapsed stacks, to PREFIX-WORKERS.txt) until SIGINT; None without a prefix."""
    if not prefix:
        return None
    output = f"{prefix}-{workers}.txt"
    command = [harness.venv_command("py-spy"), "record", "-p", str(pid), "-r", "500", "-f", "raw", "-o", output]
    profiler = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached before the measured stretch starts
    return profiler


def part_b(args, folder: Path) -> list[dict]:
    from distributed import Client

    from shoal.pipeline.cluster import pull_queue

    catalog, profile = write_catalog(folder), write_profile(folder)
    spec = model_spec(args.batch_model)
    rows = []
    for count in args.real_workers:
        scheduler, address = start_scheduler(folder, catalog, args.code)
        workers = start_workers(
            address, count, catalog, profile, min(args.worker_processes, count), args.code, args.batch_model
        )
        worker_pids = [proc.pid for proc in workers]
        try:
            with Client(address, timeout=60) as client:
                client.wait_for_workers(count, timeout=300)
                plugin_workers = 0
                while plugin_workers < count:  # every worker's pull loop has reported
                    plugin_workers = len(client.sync(pull_queue(client).overview)["workers"])
                    time.sleep(0.2)
                items = [
                    {
                        "key": str(i),
                        "model": args.batch_model,
                        "op": "sim",
                        "rows": args.item_rows,
                        "payload": {"tokens": [args.item_tokens] * args.item_rows},
                    }
                    for i in range(args.real_items)
                ]
                # Idle: Dask's heartbeats and the pulls' renewals, a cost per second, not per item.
                worker_cpu0 = cpu_seconds(worker_pids)
                with ProcessClock(scheduler.pid) as idle:
                    time.sleep(3.0)
                idle_share = idle.share
                worker_idle_share = (cpu_seconds(worker_pids) - worker_cpu0) / idle.seconds
                worker_cpu0 = cpu_seconds(worker_pids)
                profiler = profile_process(scheduler.pid, args.profile_scheduler, count)
                with ProcessClock(scheduler.pid) as busy:
                    client.sync(submit_job, client, "scale", items, {"models": {args.batch_model: spec}})
                    while not client.sync(pull_queue(client).job_status, job="scale")["complete"]:
                        time.sleep(0.05)
                worker_cpu = cpu_seconds(worker_pids) - worker_cpu0
                wall, cpu = busy.seconds, busy.cpu_seconds
                if profiler is not None:
                    profiler.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
                    profiler.wait(60)
                client.sync(pull_queue(client).job_release, job="scale")
        finally:
            for proc in workers:
                proc.kill()
            scheduler.terminate()
            scheduler.wait(30)
        net = max(cpu - idle_share * wall, 0.0)
        worker_net = max(worker_cpu - worker_idle_share * wall, 0.0)
        row = {
            "workers": count,
            "worker_processes": len(workers),
            "model": args.batch_model,
            "rows_per_item": args.item_rows,
            "tokens_per_row": args.item_tokens,
            "items": args.real_items,
            "scheduler_cpu_us_per_item": cpu / args.real_items * 1e6,
            "scheduler_net_cpu_us_per_item": net / args.real_items * 1e6,
            "scheduler_idle_share": idle_share,
            "worker_cpu_us_per_item": worker_cpu / args.real_items * 1e6,
            "worker_net_cpu_us_per_item": worker_net / args.real_items * 1e6,
            "worker_idle_share": worker_idle_share,
            "items_per_second_wall": args.real_items / wall,
            "scheduler_cpu_share": cpu / wall,
        }
        rows.append(row)
        print(
            f"  {count:>4} workers over TCP: scheduler {row['scheduler_cpu_us_per_item']:6.1f} us CPU per item "
            f"({row['scheduler_net_cpu_us_per_item']:6.1f} net of idle, {idle_share:.1%} of a core idle); "
            f"workers {row['worker_cpu_us_per_item']:7.1f} us per item ({row['worker_net_cpu_us_per_item']:7.1f} "
            f"net, {worker_idle_share:.1%} idle); {row['items_per_second_wall']:5.0f} items/s, "
            f"scheduler busy {row['scheduler_cpu_share']:.0%}",
            flush=True,
        )
    return rows


# -- (c) online over real comms -----------------------------------------------------------------

# A closed loop of `concurrency` clients, each one text of `text_bytes` per request. CPU of the metered
# processes (scheduler, gateway, workers, this generator) is read at the start and end of the measured
# stretch, after a warm-up (connections, the first requests), so it covers exactly the requests counted.
LOAD_SCRIPT = """
import asyncio, json, sys, time
import aiohttp, msgpack, psutil
def cpu(groups):
    return {name: sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids) for name, pids in groups.items()}
async def main(urls, model, seconds, warmup, concurrency, text_bytes, groups):
    text = ("lorem ipsum dolor sit amet " * (text_bytes // 27 + 1))[:text_bytes]
    body = msgpack.packb({"texts": [text]})
    headers = {"Content-Type": "application/msgpack", "Accept": "application/msgpack"}
    groups["generator"] = [psutil.Process().pid]
    done, errors, stop = [], 0, False
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def client(n):
            nonlocal errors
            url = urls[n % len(urls)] + "/v1/encode/" + model
            while not stop:
                began = time.perf_counter()
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    if response.status != 200:
                        errors += 1
                        continue
                done.append((time.perf_counter(), time.perf_counter() - began))
        clients = [asyncio.create_task(client(n)) for n in range(concurrency)]
        await asyncio.sleep(warmup)
        cpu0, wall0, errors0 = cpu(groups), time.perf_counter(), errors
        await asyncio.sleep(seconds)
        cpu1, wall1 = cpu(groups), time.perf_counter()
        errors -= errors0
        stop = True
        await asyncio.gather(*clients)
    latencies = sorted(latency for end, latency in done if wall0 <= end <= wall1)
    print(json.dumps({"requests": len(latencies), "errors": errors, "seconds": wall1 - wall0,
                      "per_second": len(latencies) / (wall1 - wall0),
                      "p50_ms": latencies[len(latencies) // 2] * 1e3, "p99_ms": latencies[int(len(latencies) * 0.99)] * 1e3,
                      "cpu_seconds": {name: cpu1[name] - cpu0[name] for name in cpu0}}))
a = sys.argv
asyncio.run(main(a[1].split(","), a[2], float(a[3]), float(a[4]), int(a[5]), int(a[6]), json.loads(a[7])))
"""


def load(
    urls: list[str], model: str, seconds: float, concurrency: int, text_bytes: int, groups: dict[str, list[int]]
) -> dict:
    """One closed-loop run; `groups`: pids by name, whose CPU over the measured stretch the result carries."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            LOAD_SCRIPT,
            ",".join(urls),
            model,
            str(seconds),
            "1.0",
            str(concurrency),
            str(text_bytes),
            json.dumps(groups),
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 120,
        check=True,
    )
    return json.loads(out.stdout)


def start_gateway(address: str, catalog: Path, profile: Path, code: str | None = None) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [
            harness.venv_command("shoal"),
            "gateway",
            "--scheduler",
            address,
            "--catalog",
            str(catalog),
            "--profile",
            str(profile),
            "--port",
            "0",
        ],
        env=code_env(code),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if "gateway on" in line:
            return proc, line.split("gateway on ")[1].split()[0]
    raise RuntimeError("shoal gateway did not start")


def wait_ready(url: str) -> None:
    import urllib.request

    while True:
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=10) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)


def part_c(args, folder: Path) -> list[dict]:
    """Online requests through the embedded gateway and through `shoal gateway` processes, at each number in
    flight and text size: requests/s, latency, and CPU per request of every process, net of its idle."""
    from distributed import Client

    from shoal.pipeline.cluster import pull_queue

    catalog, profile = write_catalog(folder), write_profile(folder)
    model = args.online_model
    scheduler, address = start_scheduler(folder, catalog, args.code)
    workers = start_workers(
        address,
        args.online_workers,
        catalog,
        profile,
        min(args.worker_processes, args.online_workers),
        args.code,
        model,
    )
    gateways: list[subprocess.Popen] = []
    rows = []
    try:
        with Client(address, timeout=60) as client:
            client.wait_for_workers(args.online_workers, timeout=300)
            embedded = client.sync(
                pull_queue(client).gateway_start, settings={"port": 0}, models={model: model_spec(model)}
            )["url"]
            urls = []
            for _ in range(max(args.gateways, default=0)):
                proc, url = start_gateway(address, catalog, profile, args.code)
                gateways.append(proc)
                urls.append(url)
            for url in [embedded, *urls]:
                wait_ready(url)
            groups = {
                "scheduler": [scheduler.pid],
                "workers": [proc.pid for proc in workers],
                "gateways": [proc.pid for proc in gateways],
            }
            # Idle, everything connected: heartbeats, the workers' waiting pulls and the gateways' answer polls.
            time.sleep(2.0)
            cpu0, wall0 = {name: cpu_seconds(pids) for name, pids in groups.items()}, time.perf_counter()
            time.sleep(4.0)
            wall = time.perf_counter() - wall0
            idle = {name: (cpu_seconds(pids) - cpu0[name]) / wall for name, pids in groups.items()}
            print(
                "  idle, share of a core: " + ", ".join(f"{name} {share:.1%}" for name, share in idle.items()),
                flush=True,
            )
            setups = {"embedded gateway": [embedded]} | {
                f"{n} shoal gateway{'s' if n > 1 else ''}": urls[:n] for n in args.gateways
            }
            for rep in range(args.reps):
                for name, targets in setups.items():
                    for text_bytes in args.text_bytes:
                        for concurrency in args.concurrency:
                            measured = load(targets, model, args.seconds, concurrency, text_bytes, groups)
                            row = online_row(name, rep, concurrency, text_bytes, measured, idle, model)
                            rows.append(row)
                            print(online_line(row), flush=True)
    finally:
        for proc in gateways:
            proc.terminate()
        for proc in workers:
            proc.kill()
        scheduler.terminate()
        scheduler.wait(30)
    return rows


def online_row(
    setup: str,
    rep: int,
    concurrency: int,
    text_bytes: int,
    measured: dict,
    idle: dict[str, float],
    model: str,
) -> dict:
    """CPU per request by process, as measured and net of each process's idle (a per-second cost)."""
    requests = max(measured["requests"], 1)
    row = {"setup": setup, "rep": rep, "model": model, "in_flight": concurrency, "text_bytes": text_bytes}
    row |= {k: measured[k] for k in ("requests", "errors", "per_second", "p50_ms", "p99_ms")}
    for name, cpu in measured["cpu_seconds"].items():
        idle_cpu = idle.get(name, 0.0) * measured["seconds"]  # every process runs in every setup: all idle
        row[f"{name}_cpu_us_per_request"] = cpu / requests * 1e6
        row[f"{name}_net_cpu_us_per_request"] = max(cpu - idle_cpu, 0.0) / requests * 1e6
    return row


def online_line(row: dict) -> str:
    return (
        f"  {row['setup']:>17}, {row['in_flight']:>2} in flight, {row['text_bytes']:>5} B texts: "
        f"{row['per_second']:6.0f} req/s, p50/p99 {row['p50_ms']:5.1f}/{row['p99_ms']:6.1f} ms, "
        f"errors {row['errors']}; CPU us per request (net of idle): "
        f"scheduler {row['scheduler_cpu_us_per_request']:5.0f} ({row['scheduler_net_cpu_us_per_request']:5.0f}), "
        f"gateway process {row['gateways_cpu_us_per_request']:5.0f}, "
        f"workers {row['workers_cpu_us_per_request']:6.0f} ({row['workers_net_cpu_us_per_request']:6.0f}), "
        f"generator {row['generator_cpu_us_per_request']:4.0f}"
    )


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


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def figures(results: dict) -> list[harness.Figure]:
    """Scheduler CPU per item over real comms, net of idle, at each worker count measured."""
    return [
        harness.Figure(
            f"(b) scheduler CPU per item, {row['workers']} workers",
            round(row["scheduler_net_cpu_us_per_item"], 1),
            "us",
        )
        for row in results.get("b", [])
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="a", help="comma-separated: a, b, c")
    parser.add_argument("--workers", default="16,128,1024,4096", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--models", default="24,100,1000", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--seconds", type=float, default=4.0, help="per phase and configuration")
    parser.add_argument("--pull-timeout", type=float, default=2.0, help="(a) the stand-in workers' long-poll timeout")
    parser.add_argument("--compute-ms", type=float, default=0.0, help="(a) each batch item's simulated compute")
    parser.add_argument("--code", default=None, help="a checkout whose plugins (a), (b) and (c) run instead")
    parser.add_argument("--real-workers", default="8,32", type=int_list, help="(b)")
    parser.add_argument("--real-items", type=int, default=5000, help="(b) items per run")
    parser.add_argument("--batch-model", default="simzero", help="(b) simzero (no compute) or a catalog model")
    parser.add_argument("--item-rows", type=int, default=1, help="(b) texts per batch item")
    parser.add_argument("--item-tokens", type=int, default=8, help="(b) tokens per text")
    parser.add_argument(
        "--profile-scheduler",
        default=None,
        metavar="PREFIX",
        help="(b) sample the scheduler with py-spy over the measured stretch into PREFIX-WORKERS.txt",
    )
    parser.add_argument(
        "--worker-processes", type=int, default=4, help="(b), (c) processes the workers are spread over"
    )
    parser.add_argument("--online-workers", type=int, default=4, help="(c) workers")
    parser.add_argument("--online-model", default="simzero", help="(c) simzero (no compute) or a catalog model")
    parser.add_argument("--concurrency", default="1,8,64", type=int_list, help="(c) requests in flight")
    parser.add_argument("--text-bytes", default="100", type=int_list, help="(c) bytes of the one text per request")
    parser.add_argument("--gateways", default="1", type=int_list, help="(c) numbers of `shoal gateway` processes used")
    parser.add_argument("--reps", type=int, default=2, help="(c) rounds over the setups")
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
            print(
                f"(b) a dask scheduler process, {args.batch_model} workers in {args.worker_processes} other processes, "
                "over TCP",
                flush=True,
            )
            results["b"] = part_b(args, Path(folder))
        if "c" in parts:
            print(
                f"(c) online over TCP: {args.online_workers} {args.online_model} workers, embedded gateway and "
                f"`shoal gateway` processes",
                flush=True,
            )
            results["c"] = part_c(args, Path(folder))
    print(f"wrote {harness.write_result('scheduler_scale', results, args.json, figures(results))}")
    if args.plot and results.get("a"):
        before = json.loads(Path(args.before).read_text()).get("a", []) if args.before else []
        plot(results["a"], before, Path(args.plot))


if __name__ == "__main__":
    main()
