"""Runs Shoal's image as a cluster of containers on this machine and checks what it computes.

    make image && .venv/bin/python deploy/container_cluster.py

Not part of `make test` (minutes, and it needs podman and the image). Every container runs the image that
`make image` built, on the host network (containers reach each other on 127.0.0.1, at ports picked free here):

1. `make demo` on this machine, into out/container-cluster/host-demo: the reference vectors.
2. `shoal embed` of the demo corpus in one container with no network at all: the same vectors (cosine 1.0).
3. A cluster: `dask scheduler`, two `dask worker`s and a `shoal gateway`, each in a container of its own.
4. An online request through the gateway (OpenAI's /v1/embeddings): the demo vector of the same text.
5. `shoal embed` of the demo corpus on the cluster from a fourth container over a mounted folder (mounted in
   the workers too, at the same place, as a shared file system would be on a real cluster); a worker
   container that holds leased items is killed mid-job; the job finishes on the other one, and then runs again
   (it resumes: nothing left to do). Both times every input row is in the output exactly once, with the
   reference vector.

It prints each figure and exits non-zero at the first check that fails. docs/DEPLOY.md, "A cluster of containers".
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE = os.environ.get("SHOAL_IMAGE", f"localhost/shoal:{VERSION}")
CORPUS = ROOT / "datasets" / "demo"
WORK = ROOT / "out" / "container-cluster"
PREFIX = f"shoal-cluster-{os.getpid()}"
USER_ID = 10001  # the image's user, who writes the outputs
os.environ.setdefault("CONTAINERS_CONF", str(ROOT / "deploy" / "containers.conf"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(condition: Callable[[], object], what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"FAILED: {what} did not happen within {timeout:.0f} s")
        time.sleep(0.5)


class Containers:
    """The containers this run starts, by name; all removed at the end."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def run(self, name: str, *args: str, mounts: dict[Path, str] | None = None, network: str = "host") -> str:
        """Start IMAGE with `args` in a detached container; its name."""
        name = f"{PREFIX}-{name}"
        volumes = [f"--volume={host}:{inside}" for host, inside in (mounts or {}).items()]
        subprocess.run(
            ["podman", "run", "--detach", f"--name={name}", f"--network={network}", *volumes, IMAGE, *args],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        self.names.append(name)
        return name

    def wait(self, name: str) -> int:
        """The exit status of the container, once it exits; its log printed."""
        status = int(subprocess.run(["podman", "wait", name], check=True, capture_output=True, text=True).stdout)
        print(self.logs(name, tail=12))
        return status

    def logs(self, name: str, tail: int) -> str:
        out = subprocess.run(["podman", "logs", f"--tail={tail}", name], capture_output=True, text=True)
        return "\n".join(f"    | {line}" for line in (out.stdout + out.stderr).splitlines())

    def worker_address(self, name: str) -> str:
        """The address a `dask worker` container logged at its start."""
        found = re.search(r"Start worker at:\s+(\S+)", self.logs(name, tail=1000))
        if found is None:
            raise SystemExit(f"FAILED: {name} logged no worker address")
        return found.group(1)

    def kill(self, name: str) -> None:
        subprocess.run(["podman", "kill", "--signal=KILL", name], check=True, stdout=subprocess.DEVNULL)

    def remove_all(self) -> None:
        if self.names:
            subprocess.run(["podman", "rm", "--force", *self.names], stdout=subprocess.DEVNULL, check=False)


def vectors(directory: Path) -> dict[str, np.ndarray]:
    """id -> embedding of an output folder's parts; fails if an id is there twice."""
    table = pq.read_table(sorted(directory.glob("*.parquet")), columns=["id", "embedding"])
    ids = table.column("id").to_pylist()
    duplicates = len(ids) - len(set(ids))
    if duplicates:
        raise SystemExit(f"FAILED: {directory}: {duplicates} rows are there more than once")
    embeddings = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    return dict(zip(ids, embeddings))


def check_same(reference: dict[str, np.ndarray], directory: Path, what: str) -> None:
    """Every reference row once in `directory`, with the same vector (the lowest cosine printed)."""
    got = vectors(directory)
    if got.keys() != reference.keys():
        missing, extra = len(reference.keys() - got.keys()), len(got.keys() - reference.keys())
        raise SystemExit(f"FAILED: {what}: {missing} input rows missing, {extra} unknown ids")
    lowest = min(cosine(reference[key], got[key]) for key in reference)
    print(f"  {what}: {len(got)} rows, each once; lowest cosine to `make demo`: {lowest:.6f}")
    if round(lowest, 6) != 1.0:
        raise SystemExit(f"FAILED: {what}: vectors differ from `make demo`'s")


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def status(scheduler: str) -> dict:
    """The scheduler's overview (`shoal status --json`), from a container of the image: the same code."""
    out = subprocess.run(
        ["podman", "run", "--rm", "--network=host", IMAGE, "shoal", "status", "--scheduler", scheduler, "--json"],
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout)["cluster"] if out.returncode == 0 else {}


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def embed_online(gateway: str, text: str) -> np.ndarray:
    body = json.dumps({"model": "minilm", "input": [text]}).encode()
    request = urllib.request.Request(f"{gateway}/v1/embeddings", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return np.array(json.loads(response.read())["data"][0]["embedding"], dtype=np.float32)


def main() -> None:
    if subprocess.run(["podman", "image", "exists", IMAGE]).returncode:
        raise SystemExit(f"no image {IMAGE}: run `make image` first")
    subprocess.run(["rm", "-rf", str(WORK)], check=True)
    outputs = WORK / "outputs"
    outputs.mkdir(parents=True)
    os.chown(outputs, USER_ID, USER_ID)
    corpus = {CORPUS: "/data/in:ro", outputs: "/data/out"}

    print("1. make demo (the reference vectors)")
    subprocess.run(["make", "-s", "demo", f"DEMO_OUT={WORK / 'host-demo'}"], cwd=ROOT, check=True)
    reference = vectors(WORK / "host-demo")
    first = pq.read_table(sorted(CORPUS.glob("*.parquet"))[0], columns=["id", "text"]).slice(0, 1).to_pylist()[0]

    containers = Containers()
    try:
        print(f"2. shoal embed in one container of {IMAGE}, without a network")
        command = ("shoal", "embed", "/data/in/", "/data/out/alone/", "--model", "minilm")
        alone = containers.run("alone", *command, mounts=corpus, network="none")
        if containers.wait(alone):
            raise SystemExit("FAILED: shoal embed in a container")
        check_same(reference, outputs / "alone", "podman run IMAGE shoal embed")

        port, dashboard, gateway_port = free_port(), free_port(), free_port()
        scheduler = f"tcp://127.0.0.1:{port}"
        print(f"3. a cluster of containers: scheduler {scheduler}, two workers, a gateway on port {gateway_port}")
        containers.run(
            "scheduler", "dask", "scheduler", "--host", "127.0.0.1", "--port", str(port),
            "--dashboard-address", f"127.0.0.1:{dashboard}",
        )  # fmt: skip
        worker = (
            "dask", "worker", scheduler, "--host", "127.0.0.1", "--nthreads", "1", "--resources", "MEMORY=2e9",
            "--shoal-profile", "cpu-local", "--shoal-pin", "minilm",
        )  # fmt: skip
        # workers read the inputs and write the parts: they see the folders where the client does
        names = [containers.run(f"worker-{index}", *worker, mounts=corpus) for index in (1, 2)]
        containers.run(
            "gateway", "shoal", "gateway", "--scheduler", scheduler, "--host", "127.0.0.1", "--port", str(gateway_port)
        )
        gateway = f"http://127.0.0.1:{gateway_port}"
        wait_for(lambda: ready(f"{gateway}/readyz"), "the gateway's /readyz answering 200")
        wait_for(lambda: len(status(scheduler).get("workers", {})) == 2, "both workers pulling")
        workers = {containers.worker_address(name): name for name in names}

        print("4. an online request through the gateway")
        online = embed_online(gateway, first["text"])
        similarity = cosine(online, reference[first["id"]])
        print(f"  POST {gateway}/v1/embeddings: {online.shape[0]} dims, cosine to `make demo`: {similarity:.6f}")
        if round(similarity, 6) != 1.0:
            raise SystemExit("FAILED: the online vector differs from `make demo`'s")

        print("5. shoal embed on the cluster from a fourth container; a busy worker's container killed mid-job")
        job = ("shoal", "embed", "/data/in/", "/data/out/cluster/", "--model", "minilm", "--scheduler", scheduler)
        client = containers.run("client", *job, mounts=corpus)
        busy: list[str] = []

        def a_worker_is_busy() -> bool:
            leased = status(scheduler).get("leased", {})
            busy[:] = [address for address, count in leased.items() if count and address in workers]
            return bool(busy)

        wait_for(a_worker_is_busy, "a worker leasing an item")
        containers.kill(workers[busy[0]])
        print(f"  killed {workers[busy[0]]} ({busy[0]}), which held leased items")
        if containers.wait(client):
            raise SystemExit("FAILED: the job after the worker kill")
        lost = status(scheduler).get("events", {}).get("lost", 0)
        print(f"  the scheduler put back {lost} leased items of the lost worker")
        if not lost:
            raise SystemExit("FAILED: the killed worker held no leased item when it died")
        check_same(reference, outputs / "cluster", "the job with a worker killed")

        rerun = containers.run("client-again", *job, mounts=corpus)
        if containers.wait(rerun):
            raise SystemExit("FAILED: the job run again")
        check_same(reference, outputs / "cluster", "the same job run again")
    except BaseException:
        for name in containers.names:
            print(f"--- {name}\n{containers.logs(name, tail=30)}", file=sys.stderr)
        raise
    finally:
        containers.remove_all()
    print("all checks passed")


if __name__ == "__main__":
    main()
