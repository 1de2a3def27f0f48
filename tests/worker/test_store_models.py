"""A model folder in object storage served by `dask worker` processes whose caches are separate folders, as pods
that share no disk: each copies it once, and the job's vectors are the folder's model's."""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import numpy as np
import pytest
import s3fs
import yaml

from shoal.configs import load_catalog
from shoal.configs.fingerprints import model_fingerprint
from shoal.configs.model_store import record_path
from tests.support.cli import run_shoal
from tests.support.dask_cli import dask_cli_cluster
from tests.support.files import read_output, write_shards
from tests.support.paths import DASK
from tests.support.s3 import s3_options
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def copies(cache) -> dict[str, int]:
    """The store copies in a Shoal cache: folder name -> when its record was written (ns)."""
    models = cache / "models"
    if not models.is_dir():
        return {}
    return {p.name: record_path(p).stat().st_mtime_ns for p in models.iterdir() if record_path(p).is_file()}


def test_two_workers_with_separate_caches_copy_a_store_model_once_each(
    s3_server, tiny_model, test_profile, demo_texts, tmp_path
):
    from sentence_transformers import SentenceTransformer

    options = s3_options(s3_server)
    fs = s3fs.S3FileSystem(**options)
    bucket = f"models-{uuid.uuid4().hex[:8]}"
    fs.mkdir(bucket)
    for path in sorted(tiny_model.rglob("*")):
        if path.is_file():
            fs.put_file(str(path), f"{bucket}/bge-small/{path.relative_to(tiny_model)}")
    url = f"s3://{bucket}/bge-small/"
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"models": {"stored": {"source": url, "storage_options": options}}}))
    texts = demo_texts[:600]
    ids = write_shards(tmp_path / "in", texts, shards=3, row_group_size=100)
    caches = {name: tmp_path / f"cache-{name}" for name in ("client", "a", "b")}
    warm = ["--shoal-catalog", str(catalog), "--shoal-warm", "stored"]
    with dask_cli_cluster(tmp_path, test_profile, env={"SHOAL_CACHE_DIR": str(caches["a"])}, worker_args=warm) as (
        address,
        procs,
    ):
        second = [DASK, "worker", address, "--nthreads", "1", "--preload", "shoal.workers"]
        second += ["--shoal-profile", str(test_profile), *warm]
        env = {**os.environ, "SHOAL_CACHE_DIR": str(caches["b"])}
        procs.start(second, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: copies(caches["a"]) and copies(caches["b"]), 240, "both workers to copy the model")
        fetched = {name: copies(caches[name]) for name in ("a", "b")}
        client = {"SHOAL_CACHE_DIR": str(caches["client"]), "COLUMNS": "300"}
        by_name = run_shoal(
            "embed", str(tmp_path / "in"), str(tmp_path / "by-name"), "--model", "stored", "--catalog", str(catalog),
            "--scheduler", address, env=client,
        )  # fmt: skip
        assert by_name.returncode == 0, by_name.stderr
        by_url = run_shoal(
            "embed", str(tmp_path / "in"), str(tmp_path / "by-url"), "--model", url,
            "--storage-options", json.dumps(options), "--scheduler", address, env=client,
        )  # fmt: skip
        assert by_url.returncode == 0, by_url.stderr
    # Each worker copied it once, when it warmed the model; the jobs found their copies and fetched nothing more.
    assert {name: copies(caches[name]) for name in ("a", "b")} == fetched
    assert all(len(copied) == 1 for copied in fetched.values()) and len(copies(caches["client"])) == 1
    expected = SentenceTransformer(str(tiny_model), device="cpu").encode(texts)
    for run in ("by-name", "by-url"):
        table = read_output(tmp_path / run).sort_by("id")
        order = {doc: i for i, doc in enumerate(ids)}
        got = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
        np.testing.assert_allclose(got, expected[[order[d] for d in table.column("id").to_pylist()]], atol=1e-5)
        manifest = json.loads((tmp_path / run / "_manifest.json").read_text())
        assert manifest["complete"] and manifest["rows"] == len(ids)
    name_fp = json.loads((tmp_path / "by-name" / "_manifest.json").read_text())["model"]["fingerprint"]
    assert json.loads((tmp_path / "by-url" / "_manifest.json").read_text())["model"]["fingerprint"] == name_fp
    assert name_fp == model_fingerprint(load_catalog().get(str(tiny_model)))  # the folder's files, nothing added
