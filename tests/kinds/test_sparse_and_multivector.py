"""Sparse (SPLADE) and multi-vector (ColBERT) encodes through Shoal's whole path, against the reference libraries.

The references: sentence-transformers' `SparseEncoder.encode`, and its `MultiVectorEncoder.encode_document` /
`encode_query`, which is itself held here to ColBERT's computation written out by hand on the tiny folder's
weights (tests/support/kind_models.py). Batch runs are `shoal embed` on a real LocalCluster of two worker
processes over real Parquet; online ones are real HTTP to the gateway on the same cluster. One cluster serves
a dense, a sparse and a multi-vector model and both classifiers at once, and a worker killed mid-job loses no row.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import yaml

from shoal.configs import load_catalog, load_profile
from shoal.configs.model_resolution import ModelFiles
from shoal.pipeline.client import OnlineClient
from shoal.pipeline.cluster import pull_queue, start_local_cluster
from tests.support.classifier_models import SENTIMENT, build_tiny_sequence_classifier, build_tiny_token_classifier
from tests.support.cli import embed_args, invoke_shoal, run_shoal, shoal_options
from tests.support.files import read_output, write_profile, write_shards
from tests.support.gateway import post
from tests.support.kind_models import (
    COLBERT_DIM,
    COLBERT_DOCUMENT_LENGTH,
    build_tiny_colbert,
    build_tiny_splade,
    direct_colbert,
)
from tests.support.models import TINY_DIM, TINY_MAX_SEQ
from tests.support.worker_loss import embed_killing_a_worker

pytestmark = pytest.mark.integration  # builds models and starts a cluster of its own (conftest.py, "Two tiers")

ATOL = 1e-4  # batch composition changes float sums in the last bits
MB = 1_000_000
EVERY_KIND = ("tiny", "splade", "colbert", "sentiment", "ner")  # dense, sparse, multi-vector, both classifiers


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    return {
        "splade": build_tiny_splade(tmp_path_factory.mktemp("splade")),
        "colbert": build_tiny_colbert(tmp_path_factory.mktemp("colbert")),
        "sentiment": build_tiny_sequence_classifier(tmp_path_factory.mktemp("sentiment"), SENTIMENT),
        "ner": build_tiny_token_classifier(tmp_path_factory.mktemp("ner")),
    }


@pytest.fixture(scope="module")
def catalog(tmp_path_factory, folders, tiny_model) -> Path:
    """`tiny` (dense), `splade`, `colbert` and the classifiers `sentiment` and `ner`; all but `tiny` by folder
    alone, their kinds read from their files."""
    dense = {"kind": "embedder", "source": str(tiny_model), "dim": TINY_DIM, "max_seq_length": TINY_MAX_SEQ}
    entries = {
        "tiny": {**dense, "normalize": True, "memory_bytes": 10 * MB},
        "splade": {"source": str(folders["splade"]), "token_budget": {"cpu": 2048}},
        "colbert": {"source": str(folders["colbert"]), "token_budget": {"cpu": 2048}},
        "sentiment": {"source": str(folders["sentiment"]), "max_seq_length": TINY_MAX_SEQ},
        "ner": {"source": str(folders["ner"]), "max_seq_length": TINY_MAX_SEQ},
    }
    path = tmp_path_factory.mktemp("kinds-catalog") / "catalog.yaml"
    path.write_text(yaml.safe_dump({"models": entries}))
    return path


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> Path:
    # Each worker's model budget is 100 MB (its MEMORY resource): every tiny model fits at once, under it.
    return write_profile(tmp_path_factory.mktemp("kinds-profile"), name="kinds", rows_per_item=40, memory_fraction=1.0)


@pytest.fixture(scope="module")
def kinds_cluster(profile, catalog):
    from distributed import Client

    # Every worker holds every model from its start (pinned), so each serves every kind at once.
    pins = [arg for name in EVERY_KIND for arg in ("--shoal-pin", name)]
    local = start_local_cluster(
        load_profile(str(profile)), str(catalog), preload_argv=pins, resources={"MEMORY": 100 * MB}
    )
    with local, Client(local) as client:
        client.wait_for_workers(2)
        yield local, client


@pytest.fixture(scope="module")
def gateway(kinds_cluster, catalog):
    """The gateway on the kinds cluster, serving every model: its URL."""
    _, client = kinds_cluster
    models = {name: spec.model_dump() for name, spec in load_catalog(str(catalog)).models.items()}
    models = {name: models[name] for name in EVERY_KIND}
    reply = client.sync(pull_queue(client).gateway_start, settings={"port": 0}, models=models)
    yield reply["url"]
    client.sync(pull_queue(client).gateway_stop)


@pytest.fixture(scope="module")
def references(folders):
    from sentence_transformers import MultiVectorEncoder, SparseEncoder

    sparse = SparseEncoder(str(folders["splade"]), device="cpu", local_files_only=True)
    multi = MultiVectorEncoder(str(folders["colbert"]), device="cpu", local_files_only=True)

    def dense_sparse(texts: list[str], top_k: int | None = None) -> np.ndarray:
        return sparse.encode(texts, max_active_dims=top_k, show_progress_bar=False).to_dense().numpy()

    def tokens(texts: list[str], input_type: str = "document") -> list[np.ndarray]:
        encode = multi.encode_query if input_type == "query" else multi.encode_document
        return encode(texts, convert_to_numpy=True, show_progress_bar=False)

    return {"sparse": dense_sparse, "multivector": tokens}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, demo_texts) -> tuple[Path, list[str | None]]:
    """150 demo texts with a null and a text longer than every window, in 3 shards: (the folder, the texts)."""
    texts: list[str | None] = [*demo_texts[:148], None, " ".join(demo_texts[148:160])]
    folder = tmp_path_factory.mktemp("kinds-corpus")
    write_shards(folder, texts, shards=3, row_group_size=25)
    return folder, texts


def shoal_embed(kinds_cluster, catalog, profile, source, output, model: str, *extra: str):
    local, _ = kinds_cluster
    args = embed_args(source, output, catalog, *extra, scheduler=local.scheduler_address, profile=profile, model=model)
    return invoke_shoal(*args)


def by_id(table: pa.Table) -> dict[str, dict[str, Any]]:
    return {row["id"]: row for row in table.to_pylist()}


def densify(terms: list[dict] | None, size: int) -> np.ndarray:
    row = np.zeros(size, dtype=np.float32)
    for term in terms or []:
        row[term["index"]] = term["value"]
    return row


# -- kinds from folders, and the ColBERT reference -------------------------------------------------


def test_kinds_told_from_their_folders(folders, catalog, tmp_path):
    from sentence_transformers import MultiVectorEncoder

    splade = ModelFiles(folders["splade"]).spec("splade", str(folders["splade"]))
    assert (splade.kind, splade.dim, splade.max_seq_length) == ("sparse", 30522, TINY_MAX_SEQ)
    colbert = ModelFiles(folders["colbert"]).spec("colbert", str(folders["colbert"]))  # PyLate's layout
    assert (colbert.kind, colbert.dim, colbert.max_seq_length) == ("multivector", COLBERT_DIM, COLBERT_DOCUMENT_LENGTH)
    assert colbert.normalize
    native = tmp_path / "native"  # sentence-transformers' own multi-vector save of the same model
    MultiVectorEncoder(str(folders["colbert"]), device="cpu", local_files_only=True).save(str(native))
    resaved = ModelFiles(native).spec("native", str(native))
    assert (resaved.kind, resaved.dim, resaved.max_seq_length) == ("multivector", COLBERT_DIM, COLBERT_DOCUMENT_LENGTH)
    models = load_catalog(str(catalog)).models  # entries that give only a source
    assert (models["splade"].kind, models["colbert"].kind, models["tiny"].kind) == ("sparse", "multivector", "embedder")


def test_the_colbert_reference_is_colberts_computation(folders, references, demo_texts):
    texts = [demo_texts[0], "Short, with punctuation!", demo_texts[3] * 5]
    for input_type in ("document", "query"):
        for text, vectors in zip(texts, references["multivector"](texts, input_type)):
            expected = direct_colbert(folders["colbert"], text, input_type)
            assert vectors.shape == expected.shape
            assert np.abs(vectors - expected).max() < 1e-5


# -- batch --------------------------------------------------------------------------------------------


def test_sparse_job_equals_sparse_encoder_and_resumes(kinds_cluster, catalog, profile, corpus, references, tmp_path):
    folder, texts = corpus
    out = tmp_path / "sparse"
    done = shoal_embed(kinds_cluster, catalog, profile, folder, out, "splade")
    assert done.returncode == 0, done.stderr
    table = read_output(out)
    assert table.schema.field("sparse").type == pa.list_(pa.struct([("index", pa.int32()), ("value", pa.float32())]))
    rows = by_id(table)
    ids = [f"doc-{i}" for i in range(len(texts))]
    assert sorted(rows) == sorted(ids)  # every row once
    present = [i for i, text in enumerate(texts) if text is not None]
    expected = references["sparse"]([texts[i] for i in present])
    for i, want in zip(present, expected):
        terms = rows[ids[i]]["sparse"]
        assert [t["index"] for t in terms] == sorted(t["index"] for t in terms)  # term-id order
        assert all(t["value"] > 0 for t in terms)  # non-zero terms only
        assert np.abs(densify(terms, want.size) - want).max() < ATOL
    assert rows["doc-148"]["sparse"] is None  # the null text: a null row, kept
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["operation"] == "sparse" and manifest["complete"]
    again = shoal_embed(kinds_cluster, catalog, profile, folder, out, "splade")
    assert again.returncode == 0, again.stderr
    assert json.loads((out / "_manifest.json").read_text())["work"]["run"] == 0  # resumed: every part current


def test_sparse_job_chunked_with_top_k(kinds_cluster, catalog, profile, corpus, references, tmp_path):
    """Windows map back to their characters (text[start:end]); each window's vector is its text's, cut to 8 terms."""
    folder, texts = corpus
    out = tmp_path / "chunks"
    done = shoal_embed(
        kinds_cluster, catalog, profile, folder, out, "splade", "--chunk", "tokens=48,overlap=8", "--top-k", "8"
    )
    assert done.returncode == 0, done.stderr
    table = read_output(out).sort_by([("id", "ascending"), ("chunk", "ascending")])
    long_rows = [row for row in table.to_pylist() if row["id"] == "doc-149"]
    assert len(long_rows) > 3  # the long text: several windows
    windows = [row for row in table.to_pylist() if row["sparse"] is not None]
    source = {f"doc-{i}": text for i, text in enumerate(texts)}
    window_texts = [source[row["id"]][row["start"] : row["end"]] for row in windows]
    expected = references["sparse"](window_texts, top_k=8)
    for row, want in zip(windows, expected):
        assert len(row["sparse"]) <= 8
        assert np.abs(densify(row["sparse"], want.size) - want).max() < ATOL


def test_multivector_job_equals_multi_vector_encoder(kinds_cluster, catalog, profile, corpus, references, tmp_path):
    folder, texts = corpus
    present = [i for i, text in enumerate(texts) if text is not None]
    for name, extra, input_type, dtype in [
        ("documents", (), "document", np.float32),
        ("queries", ("--input-type", "query", "--precision", "float16"), "query", np.float16),
    ]:
        out = tmp_path / name
        done = shoal_embed(kinds_cluster, catalog, profile, folder, out, "colbert", *extra)
        assert done.returncode == 0, done.stderr
        table = read_output(out)
        arrow_type = pa.float32() if dtype is np.float32 else pa.float16()
        assert table.schema.field("embedding").type == pa.list_(pa.list_(arrow_type, COLBERT_DIM))
        rows = by_id(table)
        assert rows["doc-148"]["embedding"] is None
        expected = references["multivector"]([texts[i] for i in present], input_type)
        for i, want in zip(present, expected):
            got = np.asarray(rows[f"doc-{i}"]["embedding"], dtype=np.float32)
            assert (
                got.shape == want.shape
            )  # padding and punctuation dropped alike (documents), expansion kept (queries)
            assert np.abs(got - want.astype(dtype).astype(np.float32)).max() < (ATOL if dtype is np.float32 else 2e-3)


def test_int8_multivector_job_quantizes_every_token_with_the_jobs_calibration(
    kinds_cluster, catalog, profile, corpus, references, tmp_path
):
    """int8: each token's vector quantized as quantize_embeddings does, with ranges calibrated over every token
    of the job's first item (the manifest keeps them), so a row's matrix dequantizes near the float one."""
    from sentence_transformers.util.quantization import quantize_embeddings

    folder, texts = corpus
    done = shoal_embed(kinds_cluster, catalog, profile, folder, tmp_path / "int8", "colbert", "--precision", "int8")
    assert done.returncode == 0, done.stderr
    table = read_output(tmp_path / "int8")
    assert table.schema.field("embedding").type == pa.list_(pa.list_(pa.int8(), COLBERT_DIM))
    ranges = np.asarray(json.loads((tmp_path / "int8" / "_manifest.json").read_text())["vectors"]["ranges"], np.float32)
    assert ranges.shape == (2, COLBERT_DIM) and (ranges[0] < ranges[1]).all()
    rows = by_id(table)
    present = [i for i, text in enumerate(texts) if text is not None]
    expected = references["multivector"]([texts[i] for i in present])
    for i, want in zip(present, expected):
        got = np.asarray(rows[f"doc-{i}"]["embedding"], dtype=np.int8)
        quantized = np.asarray(quantize_embeddings(want, precision="int8", ranges=ranges))
        assert (
            got.shape == want.shape and np.abs(got.astype(int) - quantized.astype(int)).max() <= 1
        )  # a float's last bit


def test_reindex_keeps_a_sparse_output_current(kinds_cluster, catalog, corpus, references, tmp_path):
    local, _ = kinds_cluster
    folder, texts = corpus
    job = {
        "name": "sparse-docs",
        "input": str(folder),
        "output": str(tmp_path / "index"),
        "model": "splade",
        "catalog": str(catalog),
        "scheduler": local.scheduler_address,
        "top_k": 16,
        "lock": {"settle_seconds": 0.1},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    done = invoke_shoal("reindex", str(tmp_path / "job.yaml"))
    assert done.returncode == 0, done.stderr
    current = (tmp_path / "index" / "_CURRENT").read_text().strip()
    rows = by_id(read_output(tmp_path / "index" / current))
    want = references["sparse"]([texts[0]], top_k=16)[0]
    assert np.abs(densify(rows["doc-0"]["sparse"], want.size) - want).max() < ATOL
    again = invoke_shoal("reindex", str(tmp_path / "job.yaml"))
    assert again.returncode == 0, again.stderr
    manifest = json.loads((tmp_path / "index" / current / "_manifest.json").read_text())
    assert manifest["work"]["run"] == 0 and manifest["operation"] == "sparse"  # nothing changed: nothing redone


# -- online --------------------------------------------------------------------------------------------


def test_online_sparse_equals_sparse_encoder(gateway, references, demo_texts):
    texts = demo_texts[:5]
    want = references["sparse"](texts)
    status, reply = post(gateway, "/v1/sparse/splade", {"texts": texts})
    assert status == 200, reply
    assert reply["model"] == "splade" and reply["usage"]["tokens"] > 0
    for row, expected in zip(reply["sparse"], want):
        dense = np.zeros(expected.size, dtype=np.float32)
        dense[np.frombuffer(row["indices"], "<i4")] = np.frombuffer(row["values"], "<f4")
        assert np.abs(dense - expected).max() < ATOL
    with OnlineClient(gateway) as online:  # the Python client reads the same rows
        for got, expected in zip(online.sparse("splade", texts), want):
            assert got.indices.dtype == np.int32 and np.all(np.diff(got.indices) > 0)
            dense = np.zeros(expected.size, dtype=np.float32)
            dense[got.indices] = got.values
            assert np.abs(dense - expected).max() < ATOL
        assert all(len(row.indices) <= 4 for row in online.sparse("splade", texts, top_k=4))
    status, reply = post(gateway, "/v1/sparse/splade", {"texts": texts, "top_k": 4}, "application/json")
    assert status == 200, reply
    for row, expected in zip(reply["sparse"], references["sparse"](texts, top_k=4)):
        assert len(row["indices"]) <= 4
        assert (
            np.abs(
                densify([{"index": i, "value": v} for i, v in zip(row["indices"], row["values"])], 30522) - expected
            ).max()
            < ATOL
        )


def test_online_multivector_equals_multi_vector_encoder(gateway, references, demo_texts):
    texts = demo_texts[5:9]
    status, reply = post(gateway, "/v1/multivector/colbert", {"texts": texts})
    assert status == 200, reply
    assert reply["dtype"] == "float32"
    for data, shape, want in zip(reply["embeddings"], reply["shapes"], references["multivector"](texts)):
        assert np.abs(np.frombuffer(data, "<f4").reshape(shape) - want).max() < ATOL
    body = {"texts": texts, "input_type": "query", "dtype": "float16"}
    status, reply = post(gateway, "/v1/multivector/colbert", body, "application/json")
    assert status == 200, reply
    for matrix, want in zip(reply["embeddings"], references["multivector"](texts, "query")):
        assert np.abs(np.asarray(matrix) - want).max() < 2e-3
    with OnlineClient(gateway) as online:
        queries = online.multivector("colbert", texts, input_type="query", dtype="float16")
        assert all(q.dtype == np.float16 for q in queries)
        for matrix, want in zip(queries, references["multivector"](texts, "query")):
            assert np.abs(matrix.astype(np.float32) - want).max() < 2e-3
    status, reply = post(gateway, "/v1/multivector/colbert", {"texts": texts, "precision": "ubinary"})
    assert status == 200, reply
    for data, shape, want in zip(reply["embeddings"], reply["shapes"], references["multivector"](texts)):
        assert shape == [len(want), COLBERT_DIM // 8]
        assert np.array_equal(np.frombuffer(data, "u1").reshape(shape), np.packbits(want > 0, axis=-1))


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/sparse/splade", {"texts": ["a"], "top_k": 0}, 400),
        ("/v1/sparse/splade", {"texts": ["a"], "precision": "int8"}, 400),  # not a sparse field
        ("/v1/sparse/splade", {"texts": []}, 422),
        ("/v1/sparse/tiny", {"texts": ["a"]}, 400),  # a dense model
        ("/v1/sparse/nope", {"texts": ["a"]}, 404),
        ("/v1/multivector/colbert", {"texts": ["a"], "input_type": "passage"}, 400),
        ("/v1/multivector/colbert", {"texts": ["a"], "precision": "int8"}, 422),  # int8 needs the job's ranges
        ("/v1/multivector/colbert", {"texts": ["a"], "prompt": "q: "}, 400),  # the input type picks the prefix
        ("/v1/multivector/colbert", {"texts": ["word " * 200], "truncate": False}, 422),
        ("/v1/encode/colbert", {"texts": ["a"]}, 400),  # not a dense model
    ],
)
def test_bad_kind_requests_are_refused_and_the_gateway_stays_up(gateway, path, body, status):
    got, reply = post(gateway, path, body)
    assert got == status, reply
    assert reply["error"]["code"] == status
    assert post(gateway, "/v1/sparse/splade", {"texts": ["still up"]})[0] == 200


# -- every kind on one cluster, and a lost worker ------------------------------------------------------


def test_one_cluster_serves_every_kind_at_once(
    kinds_cluster, catalog, profile, corpus, gateway, references, tmp_path, demo_texts
):
    """One command embeds with the dense, sparse and multi-vector models (OUTPUT/<model>/ each) while
    `shoal classify` and `shoal extract` run beside it and online requests of all five models are answered,
    by workers that each hold all five at once, within their model budget."""
    local, client = kinds_cluster
    folder, texts = corpus
    answers: dict[str, int] = {}
    routes = (
        ("/v1/encode/", "tiny"),
        ("/v1/sparse/", "splade"),
        ("/v1/multivector/", "colbert"),
        ("/v1/classify/", "sentiment"),
        ("/v1/extract/", "ner"),
    )

    def ask_online() -> None:
        for n in range(5):
            for route, model in routes:
                status, _ = post(gateway, route + model, {"texts": [demo_texts[n]]})
                answers[f"{model}-{n}"] = status

    on_cluster = shoal_options(catalog, local.scheduler_address, profile)
    ran: dict[str, Any] = {}

    def run_beside(command: str, model: str) -> None:
        ran[command] = run_shoal(command, str(folder), str(tmp_path / model), "--model", model, *on_cluster)

    threads = [threading.Thread(target=ask_online)] + [
        threading.Thread(target=run_beside, args=pair) for pair in (("classify", "sentiment"), ("extract", "ner"))
    ]
    for thread in threads:
        thread.start()
    done = shoal_embed(kinds_cluster, catalog, profile, folder, tmp_path / "all", "tiny,splade,colbert")
    for thread in threads:
        thread.join(300)
    assert done.returncode == 0, done.stderr
    assert all(result.returncode == 0 for result in ran.values()) and len(ran) == 2, ran
    assert set(answers.values()) == {200} and len(answers) == 25
    dense, sparse, multi = (read_output(tmp_path / "all" / name) for name in ("tiny", "splade", "colbert"))
    labels, entities = read_output(tmp_path / "sentiment"), read_output(tmp_path / "ner")
    assert dense.schema.field("embedding").type == pa.list_(pa.float32(), TINY_DIM)
    assert pa.types.is_struct(sparse.schema.field("sparse").type.value_type)
    assert pa.types.is_fixed_size_list(multi.schema.field("embedding").type.value_type)
    assert labels.schema.names == ["id", "labels"] and entities.schema.names == ["id", "entities"]
    assert {table.num_rows for table in (dense, sparse, multi, labels, entities)} == {len(texts)}

    def pool_state(dask_worker) -> dict:
        pool = dask_worker.plugins["shoal-worker"].pool
        return {"loaded": pool.loaded(), "budget": pool.budget, "free": pool.free_bytes()}

    pools = client.run(pool_state).values()
    assert all(pool["budget"] == 100 * MB and pool["free"] >= 0 for pool in pools)
    assert all(set(EVERY_KIND) <= set(pool["loaded"]) for pool in pools)


def test_killed_worker_mid_sparse_job_loses_no_rows(demo_texts, folders, tmp_path):
    # 1,600 texts in 100-row items on two workers: a worker busy with an item is SIGKILLed mid-job.
    entry = {"source": str(folders["splade"]), "token_budget": {"cpu": 1024}, "max_batch_size": 16}
    ids, returncode, stderr, lost = embed_killing_a_worker(
        tmp_path, "kill-sparse", demo_texts[:1600], str(tmp_path / "out"), model=("splade", entry)
    )
    assert returncode == 0, stderr
    assert lost >= 1
    table = read_output(tmp_path / "out")
    assert sorted(table.column("id").to_pylist()) == sorted(ids)  # every row exactly once
    assert table.column("sparse").null_count == 0


def test_sparse_and_multivector_rows_into_lance(kinds_cluster, catalog, profile, corpus, tmp_path):
    """The Lance sink takes either kind's rows as they are: the same rows as the Parquet parts."""
    lance = pytest.importorskip("lance")
    folder, texts = corpus
    for model, column in (("splade", "sparse"), ("colbert", "embedding")):
        dataset = str(tmp_path / f"{model}.lance")
        done = shoal_embed(kinds_cluster, catalog, profile, folder, f"lance://{dataset}", model)
        assert done.returncode == 0, done.stderr
        stored = by_id(lance.dataset(dataset).to_table())
        assert sorted(stored) == sorted(f"doc-{i}" for i in range(len(texts)))  # every row once
        parquet = tmp_path / f"{model}-parquet"
        assert shoal_embed(kinds_cluster, catalog, profile, folder, parquet, model).returncode == 0
        for row_id, row in by_id(read_output(parquet)).items():
            if row[column] is None:
                assert stored[row_id][column] is None
            else:
                assert np.allclose(
                    np.asarray(_values(stored[row_id][column])), np.asarray(_values(row[column])), atol=ATOL
                )


def _values(cell: list) -> list:
    """A sparse row's weights by term, or a multi-vector row's matrix: comparable as arrays."""
    return [term["value"] for term in cell] if cell and isinstance(cell[0], dict) else cell


def test_quality_gate_judges_sparse_and_multivector_half_precision(catalog, demo_texts):
    """bfloat16 against fp32 torch: cosine over the vocabulary (sparse) and per token (multi-vector)."""
    from shoal.pipeline.tuning.quality_gate import PrecisionGate, candidates
    from shoal.workers.devices import DevicePlan

    plan = DevicePlan("cpu", "cpu", "float32", 10**9, 1)
    for model in ("splade", "colbert"):
        spec = load_catalog(str(catalog)).get(model)
        assert [c.runtime for c in candidates("cpu", spec.kind)] == ["torch", "torch"]
        bf16 = candidates("cpu", spec.kind)[1]
        verdict = PrecisionGate(spec, plan, demo_texts[:16], judged_set=None).check(bf16)
        assert set(verdict.figures) == {"cosine_mean", "cosine_min"}, verdict.summary()
        assert 0.9 < verdict.figures["cosine_mean"] <= 1.0 + 1e-6, verdict.summary()
