"""What each side imports: the shared modules load without the plugins, the scheduler side without torch.

Each check runs in a fresh interpreter, so modules other tests imported do not hide an import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration  # fresh interpreters are processes

HEAVY = [
    "torch",
    "sentence_transformers",
    "aiohttp",
    "shoal.workers.worker_plugin",
    "shoal.workers.pull_loop",
    "shoal.scheduler_plugins.pull_queue",
]


def imported_after(*modules: str) -> set[str]:
    """Which of HEAVY a fresh interpreter holds after importing `modules`."""
    code = f"import sys, json\nfor m in {list(modules)!r}: __import__(m)\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out.strip().splitlines()[-1]))


def test_the_modules_every_side_shares_load_neither_plugin_nor_torch():
    shared = [
        "shoal.scheduler_plugins.protocol",
        "shoal.workers.data.storage",
        "shoal.workers.data.chunking",
        "shoal.workers.data.vector_precision",
        "shoal.configs",
        "shoal.configs.kinds",
    ]
    assert imported_after(*shared) == set()


def test_configs_and_the_kinds_import_nothing_of_shoal_outside_configs():
    """The kinds' registry is read by every side (recognition runs inside configs): it stands on configs alone."""
    code = (
        "import sys, json\nimport shoal.configs.kinds, shoal.configs.model_resolution, shoal.configs.prompts\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('shoal.') and not m.startswith('shoal.configs'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == []


def test_the_client_side_of_a_batch_job_loads_no_plugin():
    assert imported_after("shoal.pipeline.jobs.embed", "shoal.pipeline.jobs.rerank", "shoal.pipeline.status") <= {
        "aiohttp"
    }


def test_the_scheduler_side_never_imports_torch():
    loaded = imported_after("shoal.scheduler_plugins.pull_queue", "shoal.scheduler_plugins.gateway.app")
    assert "torch" not in loaded and "sentence_transformers" not in loaded
    assert "shoal.scheduler_plugins.pull_queue" in loaded  # the check itself saw the plugin load


def test_importing_the_shared_modules_leaves_the_environment_alone():
    """The worker's offline settings are set by its entry point (`workers.dask_setup`), not by an import."""
    code = (
        "import os, json\nbefore = dict(os.environ)\n"
        "import workers, shoal.workers.data.storage, shoal.workers.data.chunking, configs, shoal.scheduler_plugins.protocol\n"
        "print(json.dumps(sorted(k for k in {*before, *os.environ} if before.get(k) != os.environ.get(k))))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert json.loads(out.strip().splitlines()[-1]) == []
