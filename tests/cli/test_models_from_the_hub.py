"""A Hugging Face id that is not cached is downloaded on first use, at a pinned revision, from a stand-in Hub on
127.0.0.1 (tests/support/hub.py): once by the client, once by each worker with a cache of its own, never with
HF_HUB_OFFLINE=1 or --offline."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tests.support.cli import run_shoal
from tests.support.dask_cli import dask_cli_cluster
from tests.support.files import read_output, write_shards
from tests.support.hub import stand_in_hub
from tests.support.models import build_tiny_embedder

pytestmark = [
    pytest.mark.integration,  # shoal and dask processes, and an HTTP server
    # An embedded cluster and a `dask` one, each started once, and eight `shoal` processes: 10 minutes was
    # not enough on a 2-core machine at a load average of 20 (the last `shoal models pull` cut short).
    pytest.mark.timeout(900),
]

REPO = "stand-in-org/tiny-embedder"


def embeddings(folder) -> np.ndarray:
    table = read_output(folder).sort_by("id")
    return np.stack(table.column("embedding").to_numpy(zero_copy_only=False))


def test_a_hub_id_is_downloaded_once_pinned_and_workers_fetch_that_revision_into_their_own_caches(
    tmp_path, tiny_model, test_profile, demo_texts
):
    write_shards(tmp_path / "in", demo_texts[:300], shards=2, row_group_size=100)
    with stand_in_hub() as hub:
        first = hub.publish(REPO, tiny_model)
        client_cache = tmp_path / "client-hub"
        online = {"HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "HF_HUB_CACHE": str(client_cache)}
        embed = ["embed", str(tmp_path / "in")]

        # Offline, or with --offline: today's refusal, nothing fetched, no output.
        for switch, env in (([], {**online, "HF_HUB_OFFLINE": "1"}), (["--offline"], online)):
            refused = run_shoal(*embed, str(tmp_path / "refused"), "--model", REPO, *switch, env=env)
            assert refused.returncode == 2, refused.stderr
            message = " ".join(refused.stderr.split())
            assert f"model {REPO!r} is not in the Hugging Face cache" in message
            assert f"hf download {REPO}" in message and "nothing is downloaded at run time" in message
        assert hub.files_sent() == 0 and not (tmp_path / "refused").exists()

        # First use: downloaded into the Hub cache, the manifest's model pinned to that commit's files.
        done = run_shoal(*embed, str(tmp_path / "out"), "--model", REPO, "--profile", str(test_profile), env=online)
        assert done.returncode == 0, done.stderr
        files = len(hub.commits[REPO][first])
        assert hub.files_sent(first) == files  # every file once
        snapshot = client_cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / first
        assert sorted(p.name for p in snapshot.iterdir()) == sorted(p.name for p in tiny_model.iterdir())
        manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
        assert manifest["model"]["name"] == REPO and manifest["complete"]

        # The Hub's main moves on. Workers on another cache fetch the commit the client resolved from its own
        # cache (asking the Hub nothing about main), once; a second run downloads nothing and asks nothing.
        second = hub.publish(REPO, build_tiny_embedder(tmp_path / "retrained", seed=1))
        worker_cache = tmp_path / "worker-hub"
        workers = {**online, "HF_HUB_CACHE": str(worker_cache)}
        with dask_cli_cluster(tmp_path, test_profile, env=workers) as (address, _):
            asked = len(hub.requests)
            remote = run_shoal(*embed, str(tmp_path / "remote"), "--model", REPO, "--scheduler", address, env=online)
            assert remote.returncode == 0, remote.stderr
            assert not [r for r in hub.requests[asked:] if "/revision/" in r or second in r]
            assert hub.files_sent(first) == 2 * files and hub.files_sent(second) == 0  # the worker's, once
            asked = len(hub.requests)
            again = run_shoal(*embed, str(tmp_path / "again"), "--model", REPO, "--scheduler", address, env=online)
            assert again.returncode == 0, again.stderr
            assert hub.files_sent() == 2 * files and not [r for r in hub.requests[asked:] if REPO in r]
        fetched = worker_cache / f"models--{REPO.replace('/', '--')}" / "snapshots"
        assert [p.name for p in fetched.iterdir()] == [first]
        for run in ("remote", "again"):
            np.testing.assert_array_equal(embeddings(tmp_path / run), embeddings(tmp_path / "out"))

        # `shoal models pull` fetches ahead of time (main, now the second commit) and says what it fetched.
        pulled = run_shoal("models", "pull", REPO, env=online)
        assert pulled.returncode == 0, pulled.stderr
        out = " ".join(pulled.stdout.split())
        assert f"pulled {REPO} at {second}: " in out and "files fetched" in out and "kind embedder, dim 32" in out
        assert hub.files_sent(second) >= 1  # the files whose bytes changed
        repeat = run_shoal("models", "pull", REPO, "--revision", first, env=online)
        assert repeat.returncode == 0 and f"at {first}: already cached (nothing fetched)" in " ".join(
            repeat.stdout.split()
        )
        shutil.rmtree(client_cache)
        unknown = run_shoal("models", "pull", "stand-in-org/no-such-model", env=online)
        assert unknown.returncode == 2 and "could not be downloaded from " + hub.url in " ".join(unknown.stderr.split())
