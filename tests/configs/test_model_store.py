"""A model folder in object storage (moto's S3 server), copied into a local cache once per machine, checked on
every use, fetched again when damaged, never loaded half copied (configs/model_store.py)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import uuid

import pytest
import s3fs

from shoal.configs import ConfigError
from shoal.configs import model_store as store
from shoal.configs.model_store import local_copy
from tests.support.cli import invoke_shoal
from tests.support.files import write_shards
from tests.support.processes import Processes
from tests.support.s3 import s3_options


def upload(fs: s3fs.S3FileSystem, folder, url: str) -> None:
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            fs.put_file(str(path), f"{url.removeprefix('s3://').rstrip('/')}/{path.relative_to(folder)}")


def sha256s(folder) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def stored(s3_server, tiny_model):
    """The tiny model's folder at a fresh s3:// URL: (url, storage options)."""
    options = s3_options(s3_server)
    fs = s3fs.S3FileSystem(**options)
    bucket = f"models-{uuid.uuid4().hex[:8]}"
    fs.mkdir(bucket)
    url = f"s3://{bucket}/models/tiny/"
    upload(fs, tiny_model, url)
    return url, options


def test_a_store_folder_is_copied_once_checked_on_use_and_fetched_again_when_a_file_is_damaged(
    stored, tiny_model, tmp_path, monkeypatch
):
    url, options = stored
    monkeypatch.setenv("SHOAL_CACHE_DIR", str(tmp_path / "cache"))
    first = local_copy(url, options)
    assert first.fetched and sha256s(first.folder) == sha256s(tiny_model)
    again = local_copy(url, options, pin=first.key[:16])
    assert not again.fetched and again.folder == first.folder
    # One file damaged in place (same size): found on the next use, and the folder fetched again.
    weights = next(first.folder.rglob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    repaired = local_copy(url, options)
    assert repaired.fetched and sha256s(repaired.folder) == sha256s(tiny_model)
    # A file gone: fetched again too.
    next(repaired.folder.rglob("config.json")).unlink()
    assert local_copy(url, options).fetched
    assert [p.name for p in (tmp_path / "cache" / "models").iterdir() if p.is_dir()] == [first.folder.name]


def test_a_copy_cut_short_is_never_loaded(stored, tmp_path, monkeypatch):
    url, options = stored
    monkeypatch.setenv("SHOAL_CACHE_DIR", str(tmp_path / "cache"))
    real_open = s3fs.S3FileSystem.open
    opened = []

    def dies_on_the_third_file(self, path, *args, **kwargs):
        opened.append(path)
        if len(opened) == 3:
            raise ConnectionError("the store went away")
        return real_open(self, path, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "open", dies_on_the_third_file)
    with pytest.raises(ConnectionError):
        local_copy(url, options)
    models = tmp_path / "cache" / "models"
    assert [p.name for p in models.iterdir() if p.is_dir()] == []  # no folder, not even a staging one
    monkeypatch.setattr(s3fs.S3FileSystem, "open", real_open)
    assert local_copy(url, options).fetched


def test_workers_of_one_machine_fetch_a_folder_once(stored, tmp_path):
    """Two processes at once on one cache: one fetches under the lock, the other finds it there."""
    url, options = stored
    code = (
        "import json, sys; from shoal.configs.model_store import local_copy; "
        "print(json.dumps(local_copy(sys.argv[1], json.loads(sys.argv[2])).fetched))"
    )
    env = {**os.environ, "SHOAL_CACHE_DIR": str(tmp_path / "cache")}
    with Processes() as procs:
        for _ in range(2):
            procs.start(
                [sys.executable, "-c", code, url, json.dumps(options)], env=env, stdout=subprocess.PIPE, text=True
            )
        fetched = sorted(json.loads(p.communicate(timeout=120)[0]) for p in procs)
    assert fetched == [False, True]


def test_a_folder_without_weights_is_refused_before_any_work_naming_the_url(stored, tmp_path, demo_texts, monkeypatch):
    url, options = stored
    monkeypatch.setenv("SHOAL_CACHE_DIR", str(tmp_path / "cache"))
    fs = s3fs.S3FileSystem(**options)
    bare = url.replace("/tiny/", "/no-weights/")
    for path in fs.find(url.removeprefix("s3://")):
        if not path.endswith(store.WEIGHT_SUFFIXES):
            fs.copy(path, path.replace("/tiny/", "/no-weights/"))
    with pytest.raises(ConfigError, match=f"model folder {bare}: no model weights in it"):
        local_copy(bare, options)
    write_shards(tmp_path / "in", demo_texts[:10], shards=1, row_group_size=10)
    refused = invoke_shoal(
        "embed", str(tmp_path / "in"), str(tmp_path / "out"), "--model", bare, "--storage-options", json.dumps(options)
    )
    assert refused.returncode == 2 and f"model folder {bare}: no model weights in it" in " ".join(
        refused.stderr.split()
    )
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache" / "models").exists()


def test_a_folder_changed_since_it_was_resolved_is_refused(stored, tmp_path, monkeypatch):
    url, options = stored
    monkeypatch.setenv("SHOAL_CACHE_DIR", str(tmp_path / "cache"))
    resolved = local_copy(url, options)
    s3fs.S3FileSystem(**options).pipe(f"{url.removeprefix('s3://')}README.md", b"retrained")
    with pytest.raises(ConfigError, match="changed since it was resolved"):
        local_copy(url, options, pin=resolved.key[:16])
