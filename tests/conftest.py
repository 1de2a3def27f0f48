"""The test tiers, and the fixtures' modules (tests/fixtures/: tiny models, a real multi-process Dask cluster, a
real S3 API). What tests share besides fixtures is in tests/support/, imported as `from tests.support.x import ...`.

Layout
------
Tests live by the part they test: tests/scheduler/ (the queue, leases, placement, the online queue, elastic
scaling), tests/worker/ (model pool, runtimes, tokenizing, the device thread, workers killed or frozen),
tests/gateway/ (the online endpoint, its clients, hostile requests), tests/jobs/ (batch jobs, their inputs and
outputs, resume, reindex, run, eval), tests/cli/ (commands as a user runs them: refusals, `shoal serve`,
signals, status), tests/kinds/ (one kind of model end to end against its reference library), tests/tuning/
(auto, the quality gate, `shoal tune`), tests/configs/ (catalog, profiles, model resolution), tests/deploy/ (the
image, Kubernetes manifests, `dask` CLI processes). tests/test_*.py check the tree as a whole (layering, the
namespace, the architecture map). A new test file goes into the folder of the part it tests; each folder's
__init__.py says what belongs there.

Two tiers
---------
`make test-fast` (`pytest -m unit`): the unit tests only, in seconds. A unit test starts no Dask cluster
or client, loads no model (not even the tiny ones tests/support/models.py builds), starts no S3 server and no
process: the scheduler plugin, the model pool, the device thread, configs, planning and formats are
driven in-process with fakes (tests/support/fake_scheduler.py).

`make test` (`pytest`): everything, the unit tests included. Minutes.

Which tier a test is in is decided here, in `pytest_collection_modifyitems`: every test gets the `unit`
marker unless
  - it needs one of HEAVY_FIXTURES, directly or through another fixture (`cluster`, `tiny_model`, ...), or
  - it is marked `integration` (starts a cluster, server or process itself, without those fixtures;
    mark such a test `@pytest.mark.integration`, or a whole module with `pytestmark = pytest.mark.integration`), or
  - it is marked `slow` (the real MiniLM model).
A test that forgets its `integration` mark fails in the fast tier rather than slowing it: for unit tests,
`_unit_tier_guard` refuses processes, Dask clusters, clients and servers, and the model and S3-server
libraries (torch, transformers, sentence-transformers, onnxruntime, moto; caught when not imported yet,
as in `make test-fast`, where nothing heavy runs first). The fast tier still collects every file: a model
library imported at a test module's top costs every `make test-fast` its import, so import it inside
the tests that use it (tests/worker/test_runtimes.py). One file's unit tests: `pytest -m unit tests/scheduler/test_pull_queue.py`.

Waiting
-------
Tests never sleep a fixed time for something to happen: they wait for it with `wait_for` (or
`async_wait_for` in a coroutine; tests/support/waiting.py), which polls the condition and fails with `what` if it never holds.
A sleep that stays is the thing under test (a slow client, a lease left to expire, a forward batch's
compute time) and says so in a comment.

Processes
---------
A test starts a process only through tests/support/processes.py: `Processes` (several, e.g. a `dask scheduler`
and its workers), `started` (one) or `run` (to its end, as subprocess.run). Each runs in a session of its own and
is stopped, with whatever it started, when its block exits, passed or failed; tests/test_processes.py fails on
any other way. `_no_process_outlives_its_test` below is the backstop, not the mechanism.

Caches
------
The session's caches and home are its own (below); tests/test_hermetic.py shows that what the user's caches hold
(a bf16 verdict for every model, say) changes nothing a test compares.
"""

from __future__ import annotations

import importlib.abc
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import hypothesis
import pytest

# The session's own caches and home, made fresh and removed at its end (pytest_unconfigure): no test reads or
# writes the user's (~/.cache/shoal's verdicts and ONNX exports, the Hub cache, torch's and pip's caches, tiktoken's,
# Dask's config under ~/.config/dask, which dask-kubernetes writes to on import, and its scratch space), so a run
# never depends on what ran before it, and running the tests never changes what the user's next `shoal embed`
# does. Set, not defaulted: a SHOAL_CACHE_DIR or HF_HOME in the caller's environment is exactly what must not leak
# in. HOME too, so whatever a library keeps under ~ lands here. The processes tests start inherit them all.
CALLERS_HOME = Path(os.environ.get("HOME") or Path.home())  # the user's, whose caches no test may touch
SESSION_CACHES = Path(tempfile.mkdtemp(prefix="shoal-test-caches-"))
for _variable, _folder in {
    "HOME": "home",
    "XDG_CONFIG_HOME": "home/.config",
    "XDG_DATA_HOME": "home/.local/share",
    "XDG_CACHE_HOME": "home/.cache",  # torch's (TORCH_HOME), pip's
    "SHOAL_CACHE_DIR": "shoal",
    "HF_HOME": "huggingface",
    "HF_HUB_CACHE": "huggingface/hub",
    "TIKTOKEN_CACHE_DIR": "tiktoken",  # else a temp folder every run shares
    "DASK_TEMPORARY_DIRECTORY": "dask-scratch",  # the workers' local directories
    "HYPOTHESIS_STORAGE_DIRECTORY": "hypothesis",  # else .hypothesis/ in the checkout
}.items():
    os.environ[_variable] = str(SESSION_CACHES / _folder)
    Path(os.environ[_variable]).mkdir(parents=True, exist_ok=True)
os.environ["HF_HUB_OFFLINE"] = "1"  # tests never reach outside: a stand-in Hub test turns it off for its own processes
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# A worker chooses each model's runtime for its device (workers/runtime_choice.py), measuring in the background
# on a first use. Off here: workers run fp32 torch, so every comparison with the reference library's own call is
# of fp32 torch, and no measuring process outlives a test. A test of auto's choice sets "wait" (or "background",
# with the child stood in for) itself (tests/worker/test_runtime_choice*.py, tests/tuning/test_auto_profile.py).
# Set, not defaulted, as the caches are: a caller's SHOAL_AUTO_MEASURE=background must not change what tests compare.
os.environ["SHOAL_AUTO_MEASURE"] = "off"

pytest_plugins = ["tests.fixtures.models", "tests.fixtures.cluster", "tests.fixtures.s3"]

# Property tests draw the same examples every run and keep no example database.
hypothesis.settings.register_profile("shoal", database=None, derandomize=True)
hypothesis.settings.load_profile("shoal")


def pytest_unconfigure(config) -> None:
    shutil.rmtree(SESSION_CACHES, ignore_errors=True)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """Async tests and fixtures (anyio's pytest plugin, `anyio_mode = "auto"`) run on asyncio, as Dask does."""
    return "asyncio"


# -- tiers ---------------------------------------------------------------------------------

# Fixtures that start a cluster, build or load a model, or start a server: a test needing one is not a unit test.
HEAVY_FIXTURES = {"cluster", "tiny_model", "tiny_reranker", "tiny_catalog", "s3_server"}
# Libraries a unit test must not import: models and the S3 server (checked only while they are not yet imported).
HEAVY_MODULES = {"torch", "transformers", "sentence_transformers", "onnxruntime", "moto"}
# Commands a unit test may run: system tools that take milliseconds (a tmpfs to fill up, in tests/jobs/test_bad_input.py).
UNIT_COMMANDS = {"mount", "umount"}


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        heavy = HEAVY_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if not heavy and not item.get_closest_marker("integration") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.unit)


class _RefuseHeavyImports(importlib.abc.MetaPathFinder):
    def __init__(self, refuse: Callable[[str], None]) -> None:
        self.refuse = refuse

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HEAVY_MODULES:
            self.refuse(f"imports {name}")
        return None


# -- processes ----------------------------------------------------------------------------

# Processes multiprocessing starts once for the whole session on first use (a test's cluster may be the first).
SESSION_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


class ProcessLeftRunning(UserWarning):
    """A test ended with a process it started still running: the guard stopped it; the test should have."""


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test(request):
    """Every process a test started (directly or through a function-scoped fixture) and left running is stopped
    when the test ends, passed or failed: given a few seconds to finish exiting, then SIGTERM, then SIGKILL, and
    named in a ProcessLeftRunning warning. Processes of session- and module-scoped fixtures (the shared cluster)
    were there before the test and are left alone. A unit test starts none (`_unit_tier_guard`)."""
    if request.node.get_closest_marker("unit") is not None:
        yield
        return
    import psutil

    from tests.support.processes import STOP_SECONDS

    me = psutil.Process()
    before = {child.pid for child in me.children(recursive=True)}
    yield
    left = []
    for child in me.children(recursive=True):
        try:
            if child.pid not in before and not any(h in " ".join(child.cmdline()) for h in SESSION_HELPERS):
                left.append(child)
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(left, timeout=5)  # a cluster's workers may still be on their way out
    if not alive:
        return
    named = []
    for child in alive:
        try:
            named.append(f"{child.pid} {' '.join(child.cmdline())[:120]}")
            child.terminate()
        except psutil.NoSuchProcess:
            continue
    _, stubborn = psutil.wait_procs(alive, timeout=STOP_SECONDS)
    for child in stubborn:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(stubborn, timeout=STOP_SECONDS)
    warnings.warn(
        ProcessLeftRunning(f"{request.node.nodeid} left {len(named)} process(es) running: {named}"), stacklevel=1
    )


@pytest.fixture(autouse=True)
def _unit_tier_guard(request, monkeypatch):
    """For a unit test: starting a process, a cluster, a client or a server, or importing a model library, fails it."""
    if request.node.get_closest_marker("unit") is None:
        yield
        return
    import distributed
    import distributed.core
    import distributed.deploy.spec

    def refuse(what: str) -> None:
        pytest.fail(
            f"{request.node.nodeid} is a unit test (make test-fast) but {what}: "
            "mark it @pytest.mark.integration, or give it the fixture it needs (conftest.py, HEAVY_FIXTURES)",
            pytrace=False,
        )

    def refusing(what: str):
        def refused(*args, **kwargs):
            refuse(what)

        return refused

    popen_init = subprocess.Popen.__init__

    def guarded_popen(self, args, *rest, **kwargs):
        command = Path(str(args[0] if isinstance(args, (list, tuple)) else str(args).split()[0])).name
        if command not in UNIT_COMMANDS:
            refuse(f"starts a process ({command})")
        popen_init(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded_popen)
    monkeypatch.setattr(distributed.deploy.spec.SpecCluster, "__init__", refusing("starts a Dask cluster"))
    monkeypatch.setattr(distributed.Client, "__init__", refusing("starts a Dask client"))
    monkeypatch.setattr(distributed.core.Server, "__init__", refusing("starts a Dask scheduler, worker or nanny"))
    monkeypatch.setattr(sys, "meta_path", [_RefuseHeavyImports(refuse), *sys.meta_path])
    yield
