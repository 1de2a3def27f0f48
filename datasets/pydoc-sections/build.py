"""Build `pydoc-sections`: a small retrieval set (BEIR layout) from CPython's own docs.

Source: ``pydoc_data.topics.topics``, the plain-text Language Reference topics
that ``help()`` shows (PSF License), split exactly as the demo corpus is
(``datasets/demo/build.py``'s ``paragraphs``: prose paragraphs only).

- corpus: the first PARAGRAPHS_PER_SECTION prose paragraphs under each section
  heading (headings are the lines underlined with ``*``, ``=``, ``-``, ``~`` or
  ``^``): the ones that introduce the heading's subject, and few enough that
  the set is embedded in seconds on a CPU. Exact duplicates (sections
  repeated in several topics) are kept once.
- queries: the distinct section headings that have at least one paragraph,
  as the documentation's authors wrote them (e.g. ``Augmented assignment statements``).
- qrels: a heading's query is relevant (score 1) to every paragraph under
  that heading, in any topic. These judgments come from the document's
  structure, not from assessors reading the paragraphs.

Deterministic for a given CPython and pyarrow: sorted topic order, no timestamps,
pinned writer settings. Run from anywhere:

    python datasets/pydoc-sections/build.py
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

OUT_DIR = Path(__file__).resolve().parent
DEMO_BUILD = OUT_DIR.parent / "demo" / "build.py"
UNDERLINE = re.compile(r"^([*=\-~^])\1{2,}$")
PARAGRAPHS_PER_SECTION = 3


def _demo_paragraphs():
    """The demo corpus's prose splitter, so both sets cut text the same way."""
    spec = importlib.util.spec_from_file_location("demo_build", DEMO_BUILD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.paragraphs


def sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) for each underlined heading of a topic's text."""
    lines = text.split("\n")
    out: list[tuple[str, str]] = []
    heading, body, i = None, [], 0
    while i < len(lines):
        line, rule = lines[i].strip(), lines[i + 1].strip() if i + 1 < len(lines) else ""
        if line and UNDERLINE.match(rule) and len(rule) == len(line):
            if heading:
                out.append((heading, "\n".join(body)))
            heading, body, i = line, [], i + 2
            continue
        body.append(lines[i])
        i += 1
    if heading:
        out.append((heading, "\n".join(body)))
    return out


def collect() -> tuple[list[dict], list[dict], list[dict]]:
    from pydoc_data.topics import topics

    paragraphs = _demo_paragraphs()
    passage_ids: dict[str, str] = {}
    corpus: list[dict] = []
    relevant: dict[str, list[str]] = {}  # heading -> passage ids, in first-seen order
    for key in sorted(topics):
        for heading, body in sections(topics[key]):
            for text in paragraphs(body)[:PARAGRAPHS_PER_SECTION]:
                if text not in passage_ids:
                    passage_ids[text] = f"pds-{len(passage_ids) + 1:05d}"
                    corpus.append({"id": passage_ids[text], "text": text, "topic": key})
                ids = relevant.setdefault(heading, [])
                if passage_ids[text] not in ids:
                    ids.append(passage_ids[text])
    queries, qrels = [], []
    for n, (heading, ids) in enumerate(relevant.items(), start=1):
        query_id = f"q-{n:03d}"
        queries.append({"id": query_id, "text": heading})
        qrels.extend({"query_id": query_id, "corpus_id": pid, "score": 1} for pid in ids)
    return corpus, queries, qrels


def _write(rows: list[dict], schema: pa.Schema, name: str) -> None:
    pq.write_table(
        pa.Table.from_pylist(rows, schema=schema),
        OUT_DIR / name,
        row_group_size=256,
        compression="zstd",
        compression_level=3,
        version="2.6",
        use_dictionary=True,
        write_statistics=True,
    )


def main() -> None:
    corpus, queries, qrels = collect()
    _write(corpus, pa.schema([("id", pa.string()), ("text", pa.string()), ("topic", pa.string())]), "corpus.parquet")
    _write(queries, pa.schema([("id", pa.string()), ("text", pa.string())]), "queries.parquet")
    _write(
        qrels,
        pa.schema([("query_id", pa.string()), ("corpus_id", pa.string()), ("score", pa.int32())]),
        "qrels.parquet",
    )
    print(
        f"python {sys.version.split()[0]}, pyarrow {pa.__version__}: {len(corpus)} passages, "
        f"{len(queries)} queries, {len(qrels)} judgments -> {OUT_DIR}"
    )


if __name__ == "__main__":
    main()
