"""Runtimes behind one interface: torch fp32/bf16 and ONNX Runtime fp32/int8, the export cache, missing extras.

Every runtime is compared with a direct sentence-transformers call on the same
texts (vectors) or pairs (scores), through the catalog and loading code a
worker uses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shoal.configs import ModelSpec, Profile, RuntimeChoice, load_catalog
from shoal.pipeline.tuning.quality_gate import judge_scores, judge_vectors
from shoal.workers.data.chunking import ChunkSettings, token_windows
from shoal.workers.devices import DevicePlan
from shoal.workers.runtimes import RuntimeNotInstalled, load_runtime, onnx_cache, onnx_export
from shoal.workers.runtimes.onnx_check import ExportCheckFailed
from shoal.workers.runtimes.token_counts import count_tokens
from tests.support.processes import run

PLAN = DevicePlan("cpu", "cpu", "float32", 10**9, 2)


@pytest.fixture(autouse=True)
def cache_dir(tmp_path_factory, monkeypatch):
    """One export cache for the module: loads after the first reuse it, as on a worker's disk."""
    monkeypatch.setenv("SHOAL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "shoal-cache"))


def _spec(catalog_path, name: str, runtime: str, dtype: str) -> ModelSpec:
    spec = load_catalog(catalog_path).get(name)
    return spec.model_copy(
        update={"runtimes": {"cpu": RuntimeChoice.model_validate({"runtime": runtime, "dtype": dtype})}}
    )


def _pairs(texts: list[str]) -> tuple[list[str], list[str]]:
    return [texts[(i * 7) % len(texts)][:80] for i in range(len(texts))], texts


@pytest.mark.parametrize("runtime,dtype", [("torch", "float32"), ("torch", "bfloat16"), ("onnx", "float32")])
def test_tiny_embedder_on_every_runtime_matches_a_direct_encode(tiny_catalog, tiny_model, demo_texts, runtime, dtype):
    from sentence_transformers import SentenceTransformer  # here, not at the top: `make test-fast` collects this file

    texts = demo_texts[:96] + [" ".join(demo_texts[:40]), "Café déjà vu 東京 🚀", ""]
    model = SentenceTransformer(str(tiny_model), device="cpu")
    direct = model.encode(texts, normalize_embeddings=True)
    loaded = load_runtime(_spec(tiny_catalog, "tiny", runtime, dtype), PLAN)
    try:
        vectors, truncated = loaded.embed(texts)
        lengths, counted = loaded.token_lengths(texts)
        assert counted == truncated >= 1  # the joined text at least
        # Token counts and chunk windows as the model's own (transformers) tokenizer gives them.
        expected_lengths, _ = count_tokens(model.tokenizer, loaded.spec.max_seq_length, texts)
        np.testing.assert_array_equal(lengths, expected_lengths)
        windows = token_windows(loaded.tokenizer, texts, ChunkSettings(tokens=24, overlap=6))
        expected = token_windows(model.tokenizer, texts, ChunkSettings(tokens=24, overlap=6))
        assert windows.texts == expected.texts and (windows.start == expected.start).all()
    finally:
        loaded.close()
    figures, failures = judge_vectors(vectors, direct)
    assert failures == [], figures
    if dtype == "float32":
        assert figures["cosine_min"] > 0.99999


@pytest.mark.parametrize("runtime", ["torch", "onnx"])
def test_each_text_is_tokenized_once_the_rest_ahead_of_the_device(tiny_catalog, tiny_model, demo_texts, runtime):
    """Each row tokenized once: in series on a CPU device; ahead (the head, then the rest in the tokenizer
    thread) elsewhere; vectors exact either way."""
    import threading

    from sentence_transformers import SentenceTransformer

    from shoal.workers.batching.token_batching import HEAD_ROWS

    texts = (demo_texts * 3)[: 2 * HEAD_ROWS + 77]
    direct = SentenceTransformer(str(tiny_model), device="cpu").encode(texts, normalize_embeddings=True)
    loaded = load_runtime(_spec(tiny_catalog, "tiny", runtime, "float32"), PLAN)
    calls: list[tuple[int, str]] = []
    encode = loaded.encoder.encode

    def counted(batch, pairs=None):
        calls.append((len(batch), threading.current_thread().name))
        return encode(batch, pairs)

    loaded.encoder.encode = counted
    try:
        vectors, _ = loaded.embed(texts)  # a CPU device: all at once, on the calling thread
        assert [n for n, _ in calls] == [len(texts)] and calls[0][1] == threading.current_thread().name
        calls.clear()
        loaded.tokenize_ahead = True  # as on a GPU
        ahead, _ = loaded.embed(texts)
        assert [n for n, _ in calls] == [HEAD_ROWS, len(texts) - HEAD_ROWS]  # each row once, the head first
        assert all(name.startswith("shoal-tokenize") for _, name in calls)
        np.testing.assert_allclose(ahead, vectors, atol=1e-6)
        measured = loaded.token_lengths(texts[:40])
        calls.clear()
        given, _ = loaded.embed(texts[:40], measured)  # an online group's tokens: nothing tokenized again
        assert calls == []
    finally:
        loaded.close()
    assert judge_vectors(vectors, direct)[0]["cosine_min"] > 0.99999
    np.testing.assert_allclose(given, vectors[:40], atol=1e-6)


@pytest.mark.parametrize("runtime,dtype", [("torch", "float32"), ("torch", "bfloat16"), ("onnx", "float32")])
def test_cross_encoder_on_every_runtime_is_judged_by_score_order(
    tiny_catalog, tiny_reranker, demo_texts, runtime, dtype
):
    from sentence_transformers import CrossEncoder

    queries, passages = _pairs(demo_texts[:120])
    direct = CrossEncoder(str(tiny_reranker), device="cpu", max_length=128).predict(list(zip(queries, passages)))
    loaded = load_runtime(_spec(tiny_catalog, "tiny-reranker", runtime, dtype), PLAN)
    try:
        scores, _ = loaded.score(queries, passages)
    finally:
        loaded.close()
    figures, failures = judge_scores(scores, np.asarray(direct))
    if dtype == "float32":
        assert failures == [], figures
        np.testing.assert_allclose(scores, direct, atol=1e-4)
    else:
        # The tiny reranker's wide random weights put many scores within bf16's 3 significant
        # digits of each other: bf16 reorders them, and the gate says so by name.
        assert failures == [f"Kendall tau {figures['kendall_tau']:.4f} < 0.99"]
        assert 0.8 < figures["kendall_tau"] < 0.99


@pytest.mark.parametrize("runtime", ["torch", "onnx"])
def test_each_pair_is_tokenized_once_and_scores_as_predict_past_the_window(
    tiny_catalog, tiny_reranker, demo_texts, runtime
):
    from sentence_transformers import CrossEncoder

    queries, passages = _pairs(demo_texts[:120])
    passages = [p if i % 3 else " ".join(demo_texts[i : i + 12]) for i, p in enumerate(passages)]  # 40 too long
    direct = CrossEncoder(str(tiny_reranker), device="cpu", max_length=128).predict(list(zip(queries, passages)))
    loaded = load_runtime(_spec(tiny_catalog, "tiny-reranker", runtime, "float32"), PLAN)
    calls: list[int] = []
    encode = loaded.encoder.encode

    def counted(texts, pairs=None):
        calls.append(len(texts))
        return encode(texts, pairs)

    loaded.encoder.encode = counted
    try:
        scores, truncated = loaded.score(queries, passages)
        assert calls == [len(queries)] and truncated >= 40
        measured = loaded.token_lengths(queries[:30], passages[:30])
        calls.clear()
        given, _ = loaded.score(queries[:30], passages[:30], measured)  # an online group's tokens: reused
        assert calls == []
    finally:
        loaded.close()
    np.testing.assert_allclose(scores, direct, atol=1e-4)
    np.testing.assert_allclose(given, scores[:30], atol=1e-5)  # other batches: other padding


NO_TORCH_WORKER = """
import json, sys
import numpy as np
from shoal.configs import ModelSpec
from shoal.workers.devices import DevicePlan
from shoal.workers.runtimes import load_runtime
request = json.loads(sys.stdin.read())
runtime = load_runtime(ModelSpec.model_validate(request["spec"]), DevicePlan("cpu", "cpu", "float32", 10**9, 2))
np.save(request["out"], runtime.embed(request["texts"])[0])
print(json.dumps(sorted(m for m in ("torch", "transformers", "sentence_transformers") if m in sys.modules)))
"""


def test_an_onnx_worker_loads_and_embeds_without_importing_torch(tmp_path, tiny_catalog, demo_texts):
    """What a worker process does with an ONNX choice and a cached export: torch and transformers stay out."""
    spec = _spec(tiny_catalog, "tiny", "onnx", "float32")
    texts = demo_texts[:48] + ["Café déjà vu 東京 🚀"]
    expected, _ = load_runtime(spec, PLAN).embed(texts)  # exports here if the module's cache has no entry yet
    request = {"spec": spec.model_dump(), "texts": texts, "out": str(tmp_path / "vectors.npy")}
    done = subprocess.run(
        [sys.executable, "-c", NO_TORCH_WORKER], input=json.dumps(request), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []
    np.testing.assert_array_equal(np.load(tmp_path / "vectors.npy"), expected)


def test_onnx_int8_runs_and_is_smaller(tiny_catalog, demo_texts):
    fp32 = load_runtime(_spec(tiny_catalog, "tiny", "onnx", "float32"), PLAN)
    int8 = load_runtime(_spec(tiny_catalog, "tiny", "onnx", "int8"), PLAN)
    vectors, _ = int8.embed(demo_texts[:32])
    assert vectors.shape == (32, fp32.spec.dim) and np.isfinite(vectors).all()
    assert int8.memory_bytes() < fp32.memory_bytes()


def test_onnx_int8_weights_have_a_scale_per_output_channel(tiny_catalog):
    """One scale per matrix lets its largest weights set every weight's step: each linear layer's scale is a vector."""
    import onnx
    from onnx import numpy_helper

    int8 = load_runtime(_spec(tiny_catalog, "tiny", "onnx", "int8"), PLAN)
    graph = onnx.load(str(int8.artifact.graph)).graph
    weights = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    layers = [n for n in graph.node if n.op_type == "MatMulInteger"]
    assert layers
    for node in layers:
        scale = next(weights[name] for name in weights if name == node.input[1].replace("_quantized", "_scale"))
        assert scale.shape == (weights[node.input[1]].shape[1],), node.name


def test_second_start_reuses_the_export_and_a_truncated_graph_is_rebuilt(tiny_catalog, demo_texts, monkeypatch):
    spec = _spec(tiny_catalog, "tiny", "onnx", "float32")
    first = load_runtime(spec, PLAN)
    expected, _ = first.embed(demo_texts[:16])
    graph = first.artifact.graph

    def no_export(*args, **kwargs):
        raise AssertionError("exported again although the cache holds a valid graph")

    with monkeypatch.context() as patched:
        patched.setattr(onnx_cache, "_build", no_export)
        again = load_runtime(spec, PLAN)
    assert not again.artifact.exported and again.artifact.graph == graph

    data = graph.read_bytes()
    graph.write_bytes(data[: len(data) // 2])  # a half-written file, as a killed copy leaves it
    rebuilt = load_runtime(spec, PLAN)
    assert rebuilt.artifact.exported and rebuilt.artifact.graph.stat().st_size == len(data)
    np.testing.assert_allclose(rebuilt.embed(demo_texts[:16])[0], expected, atol=1e-5)

    (rebuilt.artifact.directory / onnx_cache.RECORD_FILE).unlink()  # no record: never trusted
    assert load_runtime(spec, PLAN).artifact.exported


def test_export_check_catches_a_model_left_in_training_mode(tiny_catalog, monkeypatch):
    """The trap: an export that leaves dropout on must never be cached."""
    real = onnx_export._embedder_graph

    def left_in_train_mode(spec):
        model, wrapper = real(spec)
        wrapper.train()
        wrapper.eval = lambda: wrapper  # as a wrapper nobody put in eval mode
        return model, wrapper

    monkeypatch.setattr(onnx_export, "_embedder_graph", left_in_train_mode)
    spec = _spec(tiny_catalog, "tiny", "onnx", "float32").model_copy(update={"max_seq_length": 100})
    with pytest.raises(ExportCheckFailed, match="training mode|does not reproduce"):
        load_runtime(spec, PLAN)
    assert not onnx_cache.entry_for(spec, "float32").exists()


def test_missing_runtime_names_the_extra(tiny_catalog, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails, as without the package
    with pytest.raises(RuntimeNotInstalled, match=r"pip install 'shoal\[onnx\]'"):
        load_runtime(_spec(tiny_catalog, "tiny", "onnx", "float32"), PLAN)


def test_profile_choice_reaches_the_spec_and_bad_pairs_are_refused():
    spec = load_catalog().get("minilm")
    profile = Profile(name="p", device="cpu", runtimes={"minilm": {"runtime": "onnx", "dtype": "float32"}})
    assert profile.tuned(spec).runtimes["cpu"].runtime == "onnx"
    assert "cuda" not in profile.tuned(spec).runtimes
    with pytest.raises(ValueError, match="int8 runs on runtime onnx"):
        RuntimeChoice(runtime="torch", dtype="int8")
    with pytest.raises(ValueError, match="float32 or int8"):
        RuntimeChoice(runtime="onnx", dtype="bfloat16")


def test_without_a_choice_gpu_workers_keep_half_precision_torch():
    from shoal.workers.runtimes import choice_for

    spec = load_catalog().get("minilm")
    assert choice_for(spec, DevicePlan("cuda:0", "cuda", "float16", 10**9)) == ("torch", "float16")
    assert choice_for(spec, PLAN) == ("torch", "float32")
    onnx_spec = spec.model_copy(update={"runtimes": {"cuda": RuntimeChoice(runtime="onnx")}})
    assert choice_for(onnx_spec, DevicePlan("cuda:0", "cuda", "bfloat16", 10**9)) == ("onnx", "float32")


def test_a_profile_naming_a_missing_runtime_fails_at_start(tmp_path, tiny_catalog):
    """`shoal embed` with onnx in the profile, on a machine where onnxruntime does not import: exit 2, the extra named."""
    shim = tmp_path / "shim" / "onnxruntime"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('No module named onnxruntime')\n")
    profile = tmp_path / "onnx.yaml"
    profile.write_text("name: onnx\ndevice: cpu\nruntimes:\n  tiny: {runtime: onnx, dtype: float32}\n")
    pq.write_table(pa.table({"text": ["a text to embed"]}), tmp_path / "in.parquet")
    env = {**os.environ, "PYTHONPATH": str(shim.parent)}
    done = run(
        [
            str(Path(sys.executable).parent / "shoal"),
            "embed",
            str(tmp_path / "in.parquet"),
            str(tmp_path / "out"),
            "--model",
            "tiny",
            "--profile",
            str(profile),
            "--catalog",
            str(tiny_catalog),
        ],
        timeout=120,
        env=env,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "pip install 'shoal[onnx]'" in done.stderr and "model 'tiny'" in done.stderr


def test_embed_and_rerank_jobs_on_onnx_through_a_cluster(tmp_path, tiny_catalog, tiny_model, tiny_reranker, demo_texts):
    """Whole commands on a real cluster whose profile puts both models on ONNX Runtime: same outputs as direct calls."""
    from sentence_transformers import CrossEncoder, SentenceTransformer

    from tests.support.cli import embed_args, run_shoal
    from tests.support.files import read_output, write_shards

    texts = demo_texts[:300]
    ids = write_shards(tmp_path / "in", texts, shards=2, row_group_size=64)
    profile = tmp_path / "onnx.yaml"
    profile.write_text(
        "name: onnx\ndevice: cpu\nthreads_per_worker: 2\nrows_per_item: 128\n"
        "runtimes:\n  tiny: {runtime: onnx, dtype: float32}\n  tiny-reranker: {runtime: onnx, dtype: float32}\n"
    )
    result = run_shoal(
        *embed_args(tmp_path / "in", tmp_path / "out", tiny_catalog, "--id-column", "id", profile=profile)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    table = read_output(tmp_path / "out")
    got = dict(zip(table.column("id").to_pylist(), table.column("embedding").to_pylist()))
    vectors = np.array([got[i] for i in ids], dtype=np.float32)
    direct = SentenceTransformer(str(tiny_model), device="cpu").encode(texts, normalize_embeddings=True)
    assert judge_vectors(vectors, direct)[0]["cosine_min"] > 0.9999

    queries, passages = _pairs(texts[:120])
    pair_ids = [f"pair-{i}" for i in range(len(queries))]
    pq.write_table(pa.table({"id": pair_ids, "query": queries, "passage": passages}), tmp_path / "pairs.parquet")
    result = run_shoal(
        "rerank",
        str(tmp_path / "pairs.parquet"),
        str(tmp_path / "scores"),
        "--model",
        "tiny-reranker",
        "--profile",
        str(profile),
        "--catalog",
        str(tiny_catalog),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    scored = read_output(tmp_path / "scores")
    direct_scores = CrossEncoder(str(tiny_reranker), device="cpu", max_length=128).predict(list(zip(queries, passages)))
    by_id = dict(zip(scored.column("id").to_pylist(), scored.column("score").to_pylist()))
    np.testing.assert_allclose([by_id[i] for i in pair_ids], direct_scores, atol=1e-4)
