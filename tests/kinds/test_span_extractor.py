"""Zero-shot extraction with a GLiNER span extractor: `shoal extract --labels` and `/v1/extract`, batch and
online, against GLiNER's own inference on the same texts, labels and threshold.

A tiny random GLiNER (tests/support/classifier_models.build_tiny_gliner) is loaded through the catalog and
the workers' runtime. Its catalog entry takes one text per model call, as the reference's `predict_entities`
does, so spans, labels and scores are compared exactly (a random span model scores every span near 0.5,
where batch padding's last-bit differences could move a span across the threshold). Jobs run on the
session's two-process cluster.
"""

from __future__ import annotations

import pytest
import yaml

from shoal.configs import ModelSpec, load_catalog
from shoal.pipeline.client import OnlineClient
from shoal.workers.devices import DevicePlan
from tests.support.classifier_models import build_tiny_gliner
from tests.support.cli import invoke_shoal, shoal_options
from tests.support.files import read_output, write_shards
from tests.support.gateway import post

pytestmark = pytest.mark.integration  # a tiny GLiNER: torch, transformers and gliner in the test process

LABELS = ["person", "organization", "location"]
THRESHOLD = 0.52  # about half of the random model's spans
MAX_WORDS = 64
NULL_ROW = 7


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    return str(build_tiny_gliner(tmp_path_factory.mktemp("gliner"), max_words=MAX_WORDS))


@pytest.fixture(scope="module")
def catalog(folder, tmp_path_factory) -> str:
    """The GLiNER by its folder (its kind, width and window read from gliner_config.json), one text a call."""
    path = tmp_path_factory.mktemp("gliner-catalog") / "catalog.yaml"
    path.write_text(yaml.safe_dump({"models": {"gliner": {"source": folder, "max_batch_size": 1}}}))
    return str(path)


@pytest.fixture(scope="module")
def reference(folder):
    from gliner import GLiNER

    return GLiNER.from_pretrained(folder, local_files_only=True)


@pytest.fixture(scope="module")
def texts(demo_texts) -> list[str]:
    """Demo paragraphs, two longer than the model's word limit, and text no BERT vocabulary holds whole."""
    long = [" ".join(demo_texts[i : i + 5]) for i in (0, 5)]
    return [*demo_texts[:20], *long, "Zürich’s naïve café — déjà vu? 東京 🙂", "x"]


def expected(reference, texts: list[str], labels: list[str] = LABELS, threshold: float = THRESHOLD, **options):
    """GLiNER's own answer, one text at a time, as {text, label, score, start, end} in order of start."""
    rows = []
    for text in texts:
        found = reference.predict_entities(text, labels, threshold=threshold, **options)
        spans = [
            {k: e[k] for k in ("label", "score", "start", "end")} | {"text": text[e["start"] : e["end"]]} for e in found
        ]
        rows.append(sorted(spans, key=lambda e: (e["start"], e["end"])))
    return rows


def as_dicts(entities) -> list[dict]:
    return [{"text": e.text, "label": e.label, "score": e.score, "start": e.start, "end": e.end} for e in entities]


def assert_spans_equal(got: list[list[dict]], want: list[list[dict]]) -> None:
    assert len(got) == len(want)
    for ours, theirs in zip(got, want):
        assert [(e["label"], e["start"], e["end"], e["text"]) for e in ours] == [
            (e["label"], e["start"], e["end"], e["text"]) for e in theirs
        ]
        assert all(abs(a["score"] - b["score"]) <= 1e-6 for a, b in zip(ours, theirs))


def test_a_gliner_folder_is_a_span_extractor_whose_runtime_finds_what_gliner_finds(catalog, reference, texts):
    from shoal.workers.runtimes.span_extractor import SpanExtractor

    spec = load_catalog(catalog).get("gliner")
    assert spec.kind == "span_extractor" and spec.dim == 32 and spec.max_seq_length == 512
    runtime = SpanExtractor(spec, DevicePlan("cpu", "cpu", "float32", 10**9))
    found, truncated = runtime.entities(texts, LABELS, THRESHOLD)
    assert_spans_equal([as_dicts(row) for row in found], expected(reference, texts))
    assert sum(len(row) for row in found) > len(texts)  # spans enough to compare
    words = reference.data_processor.words_splitter
    over = sum(len(list(words(text))) > MAX_WORDS for text in texts)
    assert truncated == over >= 2  # the long texts (and some paragraphs) pass its 64 words: GLiNER cuts them
    multi, _ = runtime.entities(texts[:5], ["person", "human"], 0.5, multi_label=True)
    assert_spans_equal(
        [as_dicts(row) for row in multi], expected(reference, texts[:5], ["person", "human"], 0.5, multi_label=True)
    )
    with pytest.raises(ValueError, match="name their labels"):
        runtime.entities(texts, [])
    bigger = SpanExtractor(
        ModelSpec(**{**spec.model_dump(), "max_batch_size": 64}), DevicePlan("cpu", "cpu", "float32", 10**9)
    )
    batched, _ = bigger.entities(texts, LABELS, THRESHOLD)  # token-budget batches: the same spans but where
    same = sum(  # padding moves a score across the threshold by its last bits
        [(e.label, e.start, e.end) for e in a] == [(e["label"], e["start"], e["end"]) for e in b]
        for a, b in zip(batched, expected(reference, texts))
    )
    assert same >= len(texts) - 2


def test_extract_job_with_labels_equals_gliner_and_refuses_what_it_cannot_do(
    cluster, catalog, reference, texts, tmp_path
):
    _, client = cluster
    ids = write_shards(tmp_path / "in", [*texts[:NULL_ROW], None, *texts[NULL_ROW:]], shards=2, row_group_size=10)
    options = shoal_options(catalog, client.scheduler.address)
    labels = ",".join(LABELS)
    result = invoke_shoal(
        "extract",
        str(tmp_path / "in"),
        str(tmp_path / "out"),
        "--model",
        "gliner",
        "--labels",
        labels,
        "--threshold",
        str(THRESHOLD),
        *options,
    )
    assert result.returncode == 0, result.stderr
    table = read_output(tmp_path / "out")
    rows = dict(zip(table.column("id").to_pylist(), table.column("entities").to_pylist()))
    assert sorted(rows) == sorted(ids)  # every row once
    assert rows[ids[NULL_ROW]] is None
    order = [i for i in ids if i != ids[NULL_ROW]]
    assert_spans_equal([rows[i] for i in order], expected(reference, texts))

    no_labels = invoke_shoal("extract", str(tmp_path / "in"), str(tmp_path / "x"), "--model", "gliner", *options)
    assert no_labels.returncode == 2 and "name the entities with --labels" in no_labels.stderr
    chunked = invoke_shoal(
        "extract",
        str(tmp_path / "in"),
        str(tmp_path / "y"),
        "--model",
        "gliner",
        "--labels",
        labels,
        "--chunk",
        "tokens=64",
        *options,
    )
    assert chunked.returncode == 2 and "no --chunk windows" in chunked.stderr


def test_online_extract_with_labels_per_request_equals_gliner(cluster, catalog, reference, texts):
    from shoal.pipeline.cluster import pull_queue

    _, client = cluster
    models = {"gliner": load_catalog(catalog).get("gliner").model_dump()}
    url = client.sync(pull_queue(client).gateway_start, settings={"port": 0}, models=models, replace=True)["url"]
    try:
        sample = texts[:6]
        status, reply = post(url, "/v1/extract/gliner", {"texts": sample, "labels": LABELS, "threshold": THRESHOLD})
        assert status == 200, reply
        assert_spans_equal(reply["entities"], expected(reference, sample))
        body = {"texts": sample, "labels": ["city", "company"], "threshold": 0.5, "multi_label": True}
        status, reply = post(url, "/v1/extract/gliner", body, "application/json")
        assert status == 200, reply
        assert_spans_equal(reply["entities"], expected(reference, sample, ["city", "company"], 0.5, multi_label=True))
        with OnlineClient(url) as online:
            assert_spans_equal(
                online.extract("gliner", sample[:2], labels=LABELS, threshold=THRESHOLD),
                expected(reference, sample[:2]),
            )
        for bad in (
            {"texts": ["a"]},
            {"texts": ["a"], "labels": LABELS, "aggregation": "first"},
            {"texts": ["a"], "labels": LABELS, "multi_label": "yes"},
        ):
            status, reply = post(url, "/v1/extract/gliner", bad)
            assert status == 400, reply
        assert post(url, "/v1/extract/gliner", {"texts": ["still up"], "labels": LABELS})[0] == 200
    finally:
        client.sync(pull_queue(client).gateway_stop)
