"""Classifiers: `shoal classify` and `shoal extract`, batch and online, against transformers' own pipelines.

Tiny random BERTs with classification heads (tests/support/classifier_models.py) are loaded through the
catalog and the workers' runtimes; every answer is compared with the pipeline that defines it for the same
texts: ``text-classification`` (top_k=None), ``zero-shot-classification`` and ``token-classification``
with each aggregation strategy, its stride for windows. Jobs run on the session's two-process cluster.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import yaml

from shoal.configs import ModelSpec, load_catalog
from shoal.pipeline.client import AsyncOnlineClient, OnlineClient
from shoal.workers.devices import DevicePlan
from tests.support.classifier_models import (
    BIO,
    NLI,
    SENTIMENT,
    TOPICS,
    build_tiny_sequence_classifier,
    build_tiny_token_classifier,
)
from tests.support.cli import invoke_shoal, shoal_options
from tests.support.files import read_output, write_shards
from tests.support.gateway import post

pytestmark = pytest.mark.integration  # tiny models: torch and transformers in the test process (conftest.py)

TOLERANCE = 1e-5  # padded batches against the pipeline's one text at a time
WINDOW = 128
ZERO_SHOT = ["sports", "politics", "programming"]
NULL_ROW = 50  # the input row with a null text


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    """Folders of each architecture: single-label, multi-label, NLI, BIO token classifier."""
    root = tmp_path_factory.mktemp("classifiers")
    return {
        "sentiment": str(build_tiny_sequence_classifier(root / "sentiment", SENTIMENT)),
        "topics": str(build_tiny_sequence_classifier(root / "topics", TOPICS, multi_label=True, seed=1)),
        "nli": str(build_tiny_sequence_classifier(root / "nli", NLI, seed=2)),
        "ner": str(build_tiny_token_classifier(root / "ner")),
    }


@pytest.fixture(scope="module")
def catalog(models, tmp_path_factory) -> str:
    """Each model by its folder and a shorter window: kind and labels (dim) are read from its files."""
    path = tmp_path_factory.mktemp("classifier-catalog") / "catalog.yaml"
    entries = {
        name: {"source": folder, "max_seq_length": WINDOW, "token_budget": {"cpu": 2048}}
        for name, folder in models.items()
    }
    path.write_text(yaml.safe_dump({"models": entries}))
    return str(path)


@pytest.fixture(scope="module")
def texts(demo_texts) -> list[str]:
    """Demo paragraphs, a few longer than the window, and text no BERT vocabulary holds whole."""
    long = [" ".join(demo_texts[i : i + 6]) for i in range(0, 30, 6)]
    return [*demo_texts[:80], *long, "Zürich’s naïve café — déjà vu? 東京 🙂", "x", ""]


def pipeline_of(task: str, folder: str, window: int = WINDOW, **options):
    """The transformers pipeline reading `window` tokens at most, as the catalog's model does."""
    from transformers import pipeline

    build: Any = pipeline  # the task is a variable: no overload of `pipeline` is chosen
    reference = build(task, model=folder, device="cpu", **options)
    reference.tokenizer.model_max_length = window
    return reference


def assert_labels_equal(ours: list[list[dict]], expected: list[list[dict]]) -> None:
    """Same labels in the same order (but among scores closer than the tolerance), scores within it."""
    assert len(ours) == len(expected)
    for got, want in zip(ours, expected):
        assert [g["label"] for g in got] == [w["label"] for w in want] or _near_tie(want)
        by_label = {w["label"]: w["score"] for w in want}
        assert max(abs(g["score"] - by_label[g["label"]]) for g in got) <= TOLERANCE


def _near_tie(labels: list[dict]) -> bool:
    scores = sorted(w["score"] for w in labels)
    return bool(np.min(np.diff(scores), initial=1.0) <= 2 * TOLERANCE)


def assert_entities_equal(ours: list[list[dict]], expected: list[list[dict]], texts: list[str]) -> None:
    """Same spans, labels and offsets; scores within the tolerance; each text the source's text[start:end]."""
    assert len(ours) == len(expected) == len(texts)
    for got, want, text in zip(ours, expected, texts):
        spans = [(w.get("entity_group", w.get("entity")), w["start"], w["end"]) for w in want]
        assert [(g["label"], g["start"], g["end"]) for g in got] == spans
        assert all(g["text"] == text[g["start"] : g["end"]] for g in got)
        assert all(abs(g["score"] - float(w["score"])) <= TOLERANCE for g, w in zip(got, want))


def over_window(folder: str, texts: list[str], window: int = WINDOW) -> int:
    """How many of `texts` have more tokens than `window`, by the model's own tokenizer."""
    from transformers import AutoTokenizer

    return sum(len(ids) > window for ids in AutoTokenizer.from_pretrained(folder)(texts)["input_ids"])


def spec_of(catalog: str, name: str) -> ModelSpec:
    return load_catalog(catalog).get(name)


# -- the runtimes alone -------------------------------------------------------------------


def test_kinds_and_labels_are_read_from_the_model_folders(catalog):
    kinds = {
        name: (spec_of(catalog, name).kind, spec_of(catalog, name).dim)
        for name in yaml.safe_load(open(catalog))["models"]
    }
    assert kinds == {
        "sentiment": ("classifier", 3),
        "topics": ("classifier", 5),
        "nli": ("classifier", 3),
        "ner": ("token_classifier", len(BIO)),
    }


def test_sequence_classifier_equals_the_text_classification_pipeline(catalog, models, texts):
    from shoal.workers.operations.classify_operation import rank
    from shoal.workers.runtimes.classifier import SequenceClassifier

    plan = DevicePlan("cpu", "cpu", "float32", 10**9)
    for name, function in (("sentiment", "softmax"), ("topics", "sigmoid")):
        runtime = SequenceClassifier(spec_of(catalog, name), plan)
        assert runtime.function == function
        scores, truncated = runtime.classify(texts)
        assert truncated == over_window(models[name], texts) >= 5  # the joined paragraphs, at least
        ours = [[{"label": n, "score": s} for n, s in row] for row in rank(scores, runtime.labels, None, None)]
        assert_labels_equal(ours, pipeline_of("text-classification", models[name], top_k=None, truncation=True)(texts))


def test_zero_shot_labels_equal_the_zero_shot_pipeline(catalog, models, texts):
    from shoal.workers.runtimes.classifier import SequenceClassifier

    runtime = SequenceClassifier(spec_of(catalog, "nli"), DevicePlan("cpu", "cpu", "float32", 10**9))
    reference = pipeline_of("zero-shot-classification", models["nli"])
    sample = texts[:40]
    for multi_label in (False, True):
        scores, _ = runtime.zero_shot(sample, ZERO_SHOT, "This text is about {}.", multi_label)
        expected = reference(
            sample, candidate_labels=ZERO_SHOT, hypothesis_template="This text is about {}.", multi_label=multi_label
        )
        want = np.array([[dict(zip(e["labels"], e["scores"]))[label] for label in ZERO_SHOT] for e in expected])
        assert np.abs(scores - want).max() <= TOLERANCE


@pytest.mark.parametrize("aggregation", ["none", "simple", "first", "max", "average"])
def test_token_classifier_equals_the_token_classification_pipeline(catalog, models, texts, aggregation):
    from dataclasses import asdict

    from shoal.workers.runtimes.token_classifier import TokenClassifier

    runtime = TokenClassifier(spec_of(catalog, "ner"), DevicePlan("cpu", "cpu", "float32", 10**9))
    sample = texts[:30] + texts[80:]  # the long ones and the odd ones among them
    found, truncated = runtime.entities(sample, aggregation)
    assert truncated == over_window(models["ner"], sample) >= 5
    assert sum(map(len, found)) > len(sample)  # the random head finds entities everywhere: a real comparison
    reference = pipeline_of("token-classification", models["ner"], aggregation_strategy=aggregation)
    assert_entities_equal([[asdict(e) for e in row] for row in found], reference(sample), sample)


def test_a_stride_the_window_cannot_hold_is_refused_by_name(catalog):
    from shoal.workers.runtimes.token_classifier import TokenClassifier

    runtime = TokenClassifier(spec_of(catalog, "ner"), DevicePlan("cpu", "cpu", "float32", 10**9))
    with pytest.raises(ValueError, match="leaves 8 tokens of text per window .* not more than overlap=8"):
        runtime.entities(["word " * 40], "first", stride=8, window=10)  # the tokenizer itself would panic
    assert len(runtime.entities(["word " * 40], "first", stride=7, window=10)[0][0]) > 0


# -- batch jobs on the cluster ----------------------------------------------------------------


def run_job(cluster, catalog: str, command: str, source, output, *options: str):
    _, client = cluster
    result = invoke_shoal(
        command, str(source), str(output), *options, *shoal_options(catalog, client.scheduler.address)
    )
    assert result.returncode == 0, result.stderr
    return result


@pytest.fixture(scope="module")
def shards(texts, tmp_path_factory) -> tuple[str, list[str]]:
    """The texts in three Parquet shards (one null text among them): (folder, ids)."""
    folder = tmp_path_factory.mktemp("classify-input") / "in"
    ids = write_shards(folder, [*texts[:NULL_ROW], None, *texts[NULL_ROW:]], shards=3, row_group_size=30)
    return str(folder), ids


def by_id(table: pa.Table, column: str) -> dict[str, object]:
    return dict(zip(table.column("id").to_pylist(), table.column(column).to_pylist()))


def test_classify_job_equals_the_pipeline(cluster, catalog, models, shards, texts, tmp_path):
    source, ids = shards
    run_job(cluster, catalog, "classify", source, tmp_path / "all", "--model", "sentiment")
    table = read_output(tmp_path / "all")
    assert table.column_names == ["id", "labels"]
    assert table.schema.field("labels").type == pa.list_(pa.struct([("label", pa.string()), ("score", pa.float32())]))
    got = by_id(table, "labels")
    assert sorted(got) == sorted(ids) and got[ids[NULL_ROW]] is None  # every row once; the null text's labels null
    rows = [got[i] for i in ids[:NULL_ROW] + ids[NULL_ROW + 1 :]]
    assert_labels_equal(
        rows, pipeline_of("text-classification", models["sentiment"], top_k=None, truncation=True)(texts)
    )
    manifest = json.loads((tmp_path / "all" / "_manifest.json").read_text())
    assert manifest["operation"] == "classify" and manifest["complete"] and manifest["rows"] == len(ids)


def test_multi_label_job_keeps_the_top_k_above_the_threshold(cluster, catalog, models, shards, texts, tmp_path):
    source, ids = shards
    run_job(
        cluster,
        catalog,
        "classify",
        source,
        tmp_path / "out",
        "--model",
        "topics",
        "--top-k",
        "2",
        "--threshold",
        "0.3",
    )
    got = by_id(read_output(tmp_path / "out"), "labels")
    expected = pipeline_of("text-classification", models["topics"], top_k=2, truncation=True)(texts)
    kept = [[label for label in row if label["score"] >= 0.3] for row in expected]
    assert_labels_equal([got[i] for i in ids[:NULL_ROW] + ids[NULL_ROW + 1 :]], kept)
    assert any(len(row) == 2 for row in kept) and any(len(row) < 2 for row in kept)  # both cuts bite


def test_zero_shot_job_scores_the_jobs_labels(cluster, catalog, models, shards, texts, tmp_path):
    source, ids = shards
    labels = ",".join(ZERO_SHOT)
    run_job(cluster, catalog, "classify", source, tmp_path / "out", "--model", "nli", "--labels", labels)
    got = by_id(read_output(tmp_path / "out"), "labels")
    expected = pipeline_of("zero-shot-classification", models["nli"])(texts[:60], candidate_labels=ZERO_SHOT)
    want = [[{"label": n, "score": s} for n, s in zip(e["labels"], e["scores"])] for e in expected]
    assert_labels_equal([got[i] for i in ids[:NULL_ROW] + ids[NULL_ROW + 1 : 61]], want)


def test_zero_shot_labels_on_a_model_without_entailment_are_refused_before_any_work(catalog, shards, tmp_path):
    result = invoke_shoal(
        "classify", shards[0], str(tmp_path / "out"), "--model", "sentiment", "--labels", "a,b", "--catalog", catalog
    )
    assert result.returncode == 2 and "entailment" in result.stderr
    assert not (tmp_path / "out").exists()


def test_extract_job_equals_the_pipeline(cluster, catalog, models, shards, texts, tmp_path):
    source, ids = shards
    result = run_job(cluster, catalog, "extract", source, tmp_path / "out", "--model", "ner", "--aggregation", "first")
    table = read_output(tmp_path / "out")
    entity = pa.struct(
        [
            ("text", pa.string()),
            ("label", pa.string()),
            ("score", pa.float32()),
            ("start", pa.int64()),
            ("end", pa.int64()),
        ]
    )
    assert table.schema.field("entities").type == pa.list_(entity)
    got = by_id(table, "entities")
    assert got[ids[NULL_ROW]] is None
    reference = pipeline_of("token-classification", models["ner"], aggregation_strategy="first")
    assert_entities_equal([got[i] for i in ids[:NULL_ROW] + ids[NULL_ROW + 1 :]], reference(texts), texts)
    truncated = re.search(r"texts truncated to max_seq_length\D+(\d+)", result.stderr)
    assert truncated and int(truncated.group(1)) == over_window(models["ner"], texts)  # the summary counts them


def test_chunked_extract_reads_long_texts_whole_as_the_pipelines_stride(cluster, catalog, models, texts, tmp_path):
    long = texts[80:85]
    ids = write_shards(tmp_path / "in", long, shards=1, row_group_size=10)
    options = ("--model", "ner", "--chunk", "tokens=48,overlap=12", "--labels", "PER,LOC")
    run_job(cluster, catalog, "extract", tmp_path / "in", tmp_path / "out", *options)
    got = by_id(read_output(tmp_path / "out"), "entities")
    reference = pipeline_of("token-classification", models["ner"], window=48, aggregation_strategy="simple", stride=12)
    expected = [[e for e in row if e["entity_group"] in ("PER", "LOC")] for row in reference(long)]
    assert_entities_equal([got[i] for i in ids], expected, long)
    assert max(e["end"] for e in got[ids[0]]) > len(long[0]) * 0.8  # entities from the text's end: read whole


# -- online, over HTTP ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gateway(cluster, catalog):
    """The gateway on the session's cluster, serving the classifiers: its URL."""
    from shoal.pipeline.cluster import pull_queue

    _, client = cluster
    models = {name: spec.model_dump() for name, spec in load_catalog(catalog).models.items()}
    models = {name: models[name] for name in ("sentiment", "topics", "nli", "ner")}
    reply = client.sync(pull_queue(client).gateway_start, settings={"port": 0}, models=models, replace=True)
    yield reply["url"]
    client.sync(pull_queue(client).gateway_stop)


def test_online_classify_equals_the_pipelines(gateway, models, texts):
    sample = texts[:12] + texts[80:82]  # two longer than the window: truncated, as the pipeline truncates
    status, reply = post(gateway, "/v1/classify/sentiment", {"texts": sample})
    assert status == 200, reply
    assert reply["model"] == "sentiment" and reply["usage"]["tokens"] > 0
    expected = pipeline_of("text-classification", models["sentiment"], top_k=None, truncation=True)(sample)
    assert_labels_equal(reply["labels"], expected)
    status, reply = post(gateway, "/v1/classify/topics", {"texts": sample, "top_k": 2}, "application/json")
    assert status == 200, reply
    expected = pipeline_of("text-classification", models["topics"], top_k=2, truncation=True)(sample)
    assert_labels_equal(reply["labels"], expected)
    body = {"texts": sample, "labels": ZERO_SHOT, "template": "About {}.", "multi_label": True}
    status, reply = post(gateway, "/v1/classify/nli", body)
    assert status == 200, reply
    expected = pipeline_of("zero-shot-classification", models["nli"])(
        sample, candidate_labels=ZERO_SHOT, hypothesis_template="About {}.", multi_label=True
    )
    assert_labels_equal(
        reply["labels"], [[{"label": n, "score": s} for n, s in zip(e["labels"], e["scores"])] for e in expected]
    )
    with OnlineClient(gateway) as online:  # the Python client: the same answer
        assert (
            online.classify("nli", sample, labels=ZERO_SHOT, template="About {}.", multi_label=True) == reply["labels"]
        )


def test_online_extract_equals_the_pipeline(gateway, models, texts):
    sample = texts[:12] + texts[80:82]
    for aggregation in ("simple", "average"):
        status, reply = post(gateway, "/v1/extract/ner", {"texts": sample, "aggregation": aggregation})
        assert status == 200, reply
        reference = pipeline_of("token-classification", models["ner"], aggregation_strategy=aggregation)
        assert_entities_equal(reply["entities"], reference(sample), sample)
    body = {"texts": sample, "labels": ["ORG"], "threshold": 0.3}
    status, reply = post(gateway, "/v1/extract/ner", body, "application/json")
    assert status == 200, reply
    expected = [
        [e for e in row if e["entity_group"] == "ORG" and e["score"] >= 0.3]
        for row in pipeline_of("token-classification", models["ner"], aggregation_strategy="simple")(sample)
    ]
    assert_entities_equal(reply["entities"], expected, sample)

    async def ask() -> list:
        async with AsyncOnlineClient(gateway) as online:
            return await online.extract("ner", sample, labels=["ORG"], threshold=0.3)

    assert asyncio.run(ask()) == reply["entities"]  # the asyncio client: the same answer


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/classify/sentiment", {"texts": ["a"], "top_k": 0}, 400),
        ("/v1/classify/sentiment", {"texts": ["a"], "top_k": True}, 400),
        ("/v1/classify/sentiment", {"texts": ["a"], "threshold": "high"}, 400),
        (
            "/v1/classify/sentiment",
            {"texts": ["a"], "labels": ["x", "y"]},
            400,
        ),  # no entailment label: the worker's 400
        ("/v1/classify/nli", {"texts": ["a"], "labels": []}, 400),
        ("/v1/classify/nli", {"texts": ["a"], "labels": ["x", "x"]}, 400),
        ("/v1/classify/nli", {"texts": ["a"], "labels": ["x"], "template": "no slot"}, 400),
        ("/v1/classify/nli", {"texts": ["a"], "multi_label": True}, 400),  # no labels to score alone
        ("/v1/classify/sentiment", {"texts": ["a"], "aggregation": "simple"}, 400),  # not a classify field
        ("/v1/classify/sentiment", {"texts": ["word " * 300], "truncate": False}, 422),
        # fits the window alone, not beside its hypothesis: zero-shot measures the pair
        ("/v1/classify/nli", {"texts": ["word " * 122], "labels": ["sports"], "truncate": False}, 422),
        ("/v1/classify/ner", {"texts": ["a"]}, 400),  # a token classifier
        ("/v1/extract/sentiment", {"texts": ["a"]}, 400),  # a sequence classifier
        ("/v1/extract/ner", {"texts": ["a"], "aggregation": "mean"}, 400),
        ("/v1/extract/ner", {"texts": ["a"], "top_k": 3}, 400),  # not an extract field
        ("/v1/extract/ner", {"texts": []}, 422),
        ("/v1/extract/nope", {"texts": ["a"]}, 404),
    ],
)
def test_bad_classifier_requests_are_refused_and_the_gateway_stays_up(gateway, path, body, status):
    got, reply = post(gateway, path, body)
    assert got == status, reply
    assert reply["error"]["code"] == status
    assert post(gateway, "/v1/classify/sentiment", {"texts": ["still up"]})[0] == 200


# -- the rest of the batch machinery: Lance, reindex ---------------------------------------------------


def test_classify_into_lance_holds_the_parquet_rows(cluster, catalog, shards, tmp_path):
    lance = pytest.importorskip("lance")
    source, ids = shards
    run_job(cluster, catalog, "classify", source, tmp_path / "parquet", "--model", "topics", "--top-k", "3")
    dataset = str(tmp_path / "labels.lance")
    run_job(cluster, catalog, "classify", source, f"lance://{dataset}", "--model", "topics", "--top-k", "3")
    rows = {row["id"]: row["labels"] for row in lance.dataset(dataset).to_table().to_pylist()}
    assert rows == by_id(read_output(tmp_path / "parquet"), "labels") and len(rows) == len(ids)


def test_reindex_keeps_entities_current(cluster, catalog, models, texts, tmp_path):
    ids = write_shards(tmp_path / "in", texts[:40], shards=2, row_group_size=10)
    _, client = cluster
    job = {
        "name": "entities",
        "input": str(tmp_path / "in"),
        "output": str(tmp_path / "index"),
        "model": "ner",
        "catalog": catalog,
        "scheduler": client.scheduler.address,
        "labels": ["PER"],
        "aggregation": "max",
        "lock": {"settle_seconds": 0.1},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    done = invoke_shoal("reindex", str(tmp_path / "job.yaml"))
    assert done.returncode == 0, done.stderr
    current = tmp_path / "index" / (tmp_path / "index" / "_CURRENT").read_text().strip()
    got = by_id(read_output(current), "entities")
    reference = pipeline_of("token-classification", models["ner"], aggregation_strategy="max")
    expected = [[e for e in row if e["entity_group"] == "PER"] for row in reference(texts[:40])]
    assert_entities_equal([got[i] for i in ids], expected, texts[:40])
    again = invoke_shoal("reindex", str(tmp_path / "job.yaml"))
    assert again.returncode == 0, again.stderr
    manifest = json.loads((current / "_manifest.json").read_text())
    assert manifest["work"]["run"] == 0 and manifest["operation"] == "extract"  # nothing changed: nothing redone
    job["precision"] = "int8"  # an embedding's option: refused, not ignored
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    refused = invoke_shoal("reindex", str(tmp_path / "job.yaml"))
    assert refused.returncode == 2 and "precision" in refused.stderr


# -- the quality gate -------------------------------------------------------------------------------


def test_judges_of_labels_and_spans_name_each_failing_figure():
    from types import SimpleNamespace

    from shoal.pipeline.tuning.quality_gate import judge_entities, judge_labels

    reference = np.array([[0.7, 0.2, 0.1]] * 99 + [[0.4, 0.35, 0.25]], dtype=np.float32)
    figures, failures = judge_labels(reference + 0.005, reference)
    assert figures == {"top1_agreement": 1.0, "score_delta_max": pytest.approx(0.005)} and not failures
    flipped = reference.copy()
    flipped[-2:] = [0.3, 0.4, 0.3]  # two texts' top label changes, by far more than 0.02
    figures, failures = judge_labels(flipped, reference)
    assert figures["top1_agreement"] == 0.98 and len(failures) == 2

    def span(label: str, start: int, score: float) -> SimpleNamespace:
        return SimpleNamespace(label=label, start=start, end=start + 3, score=score)

    expected = [[span("PER", 0, 0.9), span("LOC", 10, 0.8)], [span("ORG", 4, 0.6)]]
    figures, failures = judge_entities([[span("PER", 0, 0.905), span("LOC", 10, 0.8)], [span("ORG", 4, 0.6)]], expected)
    assert figures["span_agreement"] == 1.0 and figures["score_delta_max"] == pytest.approx(0.005) and not failures
    figures, failures = judge_entities([[span("PER", 0, 0.9)], [span("ORG", 5, 0.6)]], expected)
    assert figures["span_agreement"] == 0.25 and failures == ["span agreement 0.2500 < 0.98"]


def test_gate_judges_bfloat16_classifiers_against_fp32(catalog, texts):
    from shoal.pipeline.tuning.quality_gate import PrecisionGate, candidates

    plan = DevicePlan("cpu", "cpu", "float32", 10**9)
    for name, figure in (("sentiment", "top1_agreement"), ("ner", "span_agreement")):
        spec = spec_of(catalog, name)
        assert [c.dtype for c in candidates("cpu", spec.kind)] == ["float32", "bfloat16"]  # torch only
        gate = PrecisionGate(spec, plan, texts[:40], judged_set=None)
        same = gate.check(candidates("cpu", spec.kind)[0])
        assert same.passed and same.figures[figure] == 1.0 and same.figures["score_delta_max"] <= TOLERANCE
        bf16 = gate.check(candidates("cpu", spec.kind)[1])
        assert set(bf16.figures) == {figure, "score_delta_max"} and bf16.figures["score_delta_max"] > TOLERANCE


# -- a lost worker ------------------------------------------------------------------------------------


def test_killed_worker_mid_extract_job_loses_no_rows(demo_texts, models, tmp_path):
    """1,000 texts in 100-row items on a cluster of its own: a worker busy with an item is SIGKILLed mid-job;
    its items go back to the queue and every row is written once, with its entities."""
    import subprocess

    from distributed import Client

    from shoal.configs import load_profile
    from shoal.pipeline.cluster import start_local_cluster
    from tests.support.files import write_profile
    from tests.support.paths import ROOT, SHOAL
    from tests.support.processes import started
    from tests.support.worker_loss import kill_busy_worker

    profile = load_profile(str(write_profile(tmp_path, name="kill-extract", rows_per_item=100, lease_seconds=30)))
    ids = write_shards(tmp_path / "in", demo_texts[:1000], shards=4, row_group_size=50)
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"models": {"ner": {"source": models["ner"], "token_budget": {"cpu": 1024}}}}))
    with start_local_cluster(profile) as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        plugin = cluster.scheduler.extensions["shoal-pull-queue"]
        options = shoal_options(catalog, cluster.scheduler_address, profile.path)
        command = [SHOAL, "extract", str(tmp_path / "in"), str(tmp_path / "out"), "--model", "ner", *options]
        with started(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as job:
            kill_busy_worker(cluster, job)
            _, stderr = job.communicate(timeout=300)
        assert job.returncode == 0, stderr
        assert plugin.state.counts["lost"] >= 1
    table = read_output(tmp_path / "out")
    assert sorted(table.column("id").to_pylist()) == sorted(ids)  # every row exactly once
    assert table.column("entities").null_count == 0
