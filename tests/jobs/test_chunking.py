"""Chunking: long texts become overlapping token windows, embedded on the cluster, one row each."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from shoal.workers.data.chunking import ChunkSettings, token_windows
from tests.support.cli import embed_args, invoke_shoal, reindex_job
from tests.support.files import read_output, write_profile
from tests.support.models import TINY_MAX_SEQ

TOKENS, OVERLAP = 48, 12


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model), local_files_only=True)


def long_text(demo_texts, tokenizer, tokens: int) -> str:
    """Demo sentences joined until the text has at least `tokens` tokens."""
    text = ""
    for sentence in demo_texts:
        text += sentence + " "
        if len(tokenizer(text, add_special_tokens=False)["input_ids"]) >= tokens:
            return text.strip()
    raise AssertionError("the demo corpus is too short")


def test_a_2000_token_text_gives_the_expected_windows(tokenizer, demo_texts):
    text = long_text(demo_texts, tokenizer, 2000)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, spans = encoded["input_ids"], encoded["offset_mapping"]
    settings = ChunkSettings(tokens=128, overlap=32)
    windows = token_windows(tokenizer, [text, "short one"], settings)
    content = 128 - 2  # [CLS] and [SEP] are part of the window
    fewest = -(-(len(ids) - 32) // (content - 32))  # windows if every cut fell on a word edge
    count = int((windows.source == 0).sum())
    assert fewest <= count <= fewest * 1.1
    assert list(windows.source) == [0] * count + [1] and list(windows.chunk) == list(range(count)) + [0]
    sources = [text, "short one"]
    for window, source, start, end in zip(windows.texts, windows.source, windows.start, windows.end):
        assert window == sources[source][start:end]  # offsets slice the source back
    token_at_start = {span[0]: i for i, span in enumerate(spans)}
    token_at_end = {span[1]: i + 1 for i, span in enumerate(spans)}
    ranges = [(token_at_start[windows.start[n]], token_at_end[windows.end[n]]) for n in range(count)]
    assert ranges[0][0] == 0 and ranges[-1][1] == len(ids)  # every token is in a window
    for n, (first, last) in enumerate(ranges):
        assert last - first <= content
        assert tokenizer(windows.texts[n])["input_ids"] == [
            tokenizer.cls_token_id,
            *ids[first:last],
            tokenizer.sep_token_id,
        ]
        if n:
            assert ranges[n - 1][0] < first and ranges[n - 1][1] - first >= 32  # moves on, overlaps by 32 or more
    assert (windows.start[-1], windows.end[-1]) == (0, len("short one"))


def test_where_every_word_is_one_token_the_windows_are_exact(tokenizer):
    words = ("the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "home")
    text = " ".join(words[i % len(words)] for i in range(2000))
    assert len(tokenizer(text, add_special_tokens=False)["input_ids"]) == 2000
    windows = token_windows(tokenizer, [text], ChunkSettings(tokens=128, overlap=32))
    step = 126 - 32
    assert len(windows.texts) == -(-(2000 - 32) // step) == 21
    for n, window in enumerate(windows.texts):
        first, last = n * step, min(n * step + 126, 2000)
        assert window.split() == text.split()[first:last]  # exactly tokens [first, last), 32 shared with the next
        assert text[windows.start[n] : windows.end[n]] == window


@pytest.mark.parametrize(
    "text, message",
    [
        ("tokens=0", "greater than 0"),
        ("tokens=64,overlap=64", "less than tokens"),
        ("overlap=3", "tokens=N is required"),
        ("tokens=ten", "expected tokens=N"),
    ],
)
def test_bad_settings_say_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        ChunkSettings.parse(text)


def write_corpus(directory, demo_texts, tokenizer) -> tuple[list[str], list[str | None]]:
    directory.mkdir()
    texts = (
        [long_text(demo_texts[i * 40 :], tokenizer, 150 + 40 * i) for i in range(8)] + demo_texts[500:560] + [None, ""]
    )
    ids = [f"doc-{i}" for i in range(len(texts))]
    for shard, (lo, hi) in enumerate(((0, 30), (30, len(texts)))):
        pq.write_table(
            pa.table({"id": ids[lo:hi], "text": pa.array(texts[lo:hi], pa.string())}),
            directory / f"s{shard}.parquet",
            row_group_size=10,
        )
    return ids, texts


def test_chunked_embed_every_source_once_and_windows_equal_direct_encodes(
    cluster, tiny_model, tiny_catalog, tokenizer, demo_texts, tmp_path
):
    from sentence_transformers import SentenceTransformer

    _, client = cluster
    ids, texts = write_corpus(tmp_path / "in", demo_texts, tokenizer)
    args = embed_args(
        tmp_path / "in",
        tmp_path / "out",
        tiny_catalog,
        "--chunk",
        f"tokens={TOKENS},overlap={OVERLAP}",
        scheduler=client.scheduler.address,
    )
    result = invoke_shoal(*args)
    assert result.returncode == 0, result.stderr
    table = read_output(tmp_path / "out")
    assert table.column_names[:5] == ["id", "chunk", "start", "end", "embedding"]
    rows = table.to_pylist()
    assert {r["id"] for r in rows} == set(ids)  # every source id appears
    keys = [(r["id"], r["chunk"]) for r in rows]
    assert len(keys) == len(set(keys))
    text_of = dict(zip(ids, texts))
    by_id: dict[str, list] = {}
    for r in rows:
        by_id.setdefault(r["id"], []).append(r)
    expected = token_windows(
        tokenizer, [t for t in texts if t is not None], ChunkSettings(tokens=TOKENS, overlap=OVERLAP)
    )
    assert len(rows) == len(expected.texts) + 1  # the null text keeps one row, with no window
    null_row = by_id["doc-68"][0]
    assert null_row["embedding"] is None and null_row["chunk"] is None
    long = by_id["doc-7"]
    assert [r["chunk"] for r in sorted(long, key=lambda r: r["chunk"])] == list(range(len(long))) and len(long) > 3
    windows = [text_of[r["id"]][r["start"] : r["end"]] for r in rows if r["embedding"] is not None]
    assert all(len(tokenizer(w)["input_ids"]) <= TOKENS for w in windows)
    ours = np.array([r["embedding"] for r in rows if r["embedding"] is not None], dtype=np.float32)
    direct = SentenceTransformer(str(tiny_model), device="cpu").encode(windows, batch_size=32)
    np.testing.assert_allclose(ours, direct, atol=2e-5)
    assert json.loads((tmp_path / "out" / "_manifest.json").read_text())["rows"] == len(rows)

    # Resume: a lost part and the manifest; the rerun redoes that part alone, every window once.
    lost = sorted((tmp_path / "out").glob("part-*.parquet"))[1]
    lost.unlink()
    (tmp_path / "out" / "_manifest.json").unlink()
    again = invoke_shoal(*args)
    assert again.returncode == 0, again.stderr
    assert "1 run" in " ".join(again.stderr.split())
    resumed = [(r["id"], r["chunk"]) for r in read_output(tmp_path / "out").select(["id", "chunk"]).to_pylist()]
    assert sorted(resumed, key=str) == sorted(keys, key=str)


def test_reindex_with_chunking_is_a_version_of_its_own_and_stays_exactly_once(
    cluster, tiny_catalog, tokenizer, demo_texts, tmp_path
):
    _, client = cluster
    ids, _ = write_corpus(tmp_path / "in", demo_texts, tokenizer)
    profile = write_profile(tmp_path, name="reindex", rows_per_item=10)
    job = reindex_job(
        tmp_path / "in",
        tmp_path / "out",
        tiny_catalog,
        client.scheduler.address,
        profile=str(profile),
        chunk={"tokens": TOKENS, "overlap": OVERLAP},
    )
    path = tmp_path / "docs.yaml"

    def reindex(**changes) -> tuple[str, list]:
        path.write_text(yaml.safe_dump({**job, **changes}))
        result = invoke_shoal("reindex", str(path))
        assert result.returncode == 0, result.stderr
        version = (tmp_path / "out" / "_CURRENT").read_text().strip()
        table = read_output(tmp_path / "out" / version)
        return version, [(r["id"], r["chunk"]) for r in table.select(["id", "chunk"]).to_pylist()]

    first, keys = reindex()
    assert len(keys) == len(set(keys)) and {k[0] for k in keys} == set(ids)
    same, again = reindex()
    assert same == first and sorted(again) == sorted(keys)
    wider, other = reindex(chunk={"tokens": TOKENS * 2, "overlap": OVERLAP})
    assert wider != first  # chunk settings are part of the version
    assert len(other) == len(set(other)) and {k[0] for k in other} == set(ids) and len(other) < len(keys)


def test_bad_chunk_settings_exit_2_before_any_work(tiny_catalog, tmp_path):
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": ["a"], "text": ["a text"]}), tmp_path / "in" / "s.parquet")
    for setting, message in (
        ("tokens=0", "greater than 0"),
        ("tokens=32,overlap=32", "less than tokens"),
        (f"tokens={TINY_MAX_SEQ + 1}", f"more than model 'tiny' reads ({TINY_MAX_SEQ} tokens)"),
    ):
        result = invoke_shoal(*embed_args(tmp_path / "in", tmp_path / "out", tiny_catalog, "--chunk", setting))
        assert result.returncode == 2, (setting, result.stderr)
        assert message in " ".join(result.stderr.split()), (setting, result.stderr)
    assert not (tmp_path / "out").exists()


def test_run_retrieves_over_chunks_and_reports_documents(
    cluster, tiny_model, tiny_catalog, tokenizer, demo_texts, tmp_path
):
    from sentence_transformers import SentenceTransformer

    _, client = cluster
    ids, texts = write_corpus(tmp_path / "in", demo_texts, tokenizer)
    questions = [demo_texts[7 * 40 + 3], demo_texts[520][:60]]  # inside the long doc-7; a short doc's start
    pq.write_table(pa.table({"id": ids[:-2], "text": texts[:-2]}), tmp_path / "corpus.parquet")
    pq.write_table(pa.table({"qid": [0, 1], "text": questions}), tmp_path / "queries.parquet")
    job = {
        "output": "out",
        "corpus": {"input": "corpus.parquet"},
        "queries": {"input": "queries.parquet", "id_column": "qid"},
        "embed": {"model": "tiny", "chunk": {"tokens": TOKENS, "overlap": OVERLAP}},
        "retrieve": {"top_k": 5},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    result = invoke_shoal(
        "run", str(tmp_path / "job.yaml"), "--catalog", str(tiny_catalog), "--scheduler", client.scheduler.address
    )
    assert result.returncode == 0, result.stderr
    ranked = pq.read_table(tmp_path / "out" / "ranked.parquet").to_pylist()

    model = SentenceTransformer(str(tiny_model), device="cpu")
    chunks = read_output(tmp_path / "out" / "corpus-embeddings").to_pylist()
    windows = [dict(zip(ids, texts))[c["id"]][c["start"] : c["end"]] for c in chunks]
    cosine = model.encode(questions) @ model.encode(windows).T  # unit vectors: dot is cosine
    best: list[dict[str, float]] = [{}, {}]
    for column, chunk in enumerate(chunks):
        for q in (0, 1):
            best[q][chunk["id"]] = max(best[q].get(chunk["id"], -2.0), float(cosine[q, column]))
    for q in (0, 1):
        mine = sorted((r for r in ranked if r["query_id"] == q), key=lambda r: r["rank"])
        assert len({r["doc_id"] for r in mine}) == len(mine) == 5  # documents, each once
        expected = sorted(best[q].values(), reverse=True)[:5]
        np.testing.assert_allclose([r["retrieval_score"] for r in mine], expected, atol=1e-4)
        assert all(abs(best[q][r["doc_id"]] - r["retrieval_score"]) < 1e-4 for r in mine)
    record = json.loads((tmp_path / "out" / "_run.json").read_text())["stages"]["retrieve"]
    assert record["corpus"] == len(ids) - 2 and record["corpus_rows"] == len(chunks) > record["corpus"]
