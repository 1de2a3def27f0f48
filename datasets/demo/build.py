"""Build the Shoal demo corpus: ~5,000 English paragraphs in 5 Parquet shards.

Source text ships with CPython itself (PSF License):

1. ``pydoc_data.topics.topics`` -- the plain-text rendering of the Python
   Language Reference / library topics that ``help()`` shows, taken in sorted
   topic-key order;
2. if that yields too few paragraphs, docstrings of a fixed list of stdlib
   modules (module docstring, then public functions and classes in sorted
   name order, then public methods of those classes in sorted name order).

Text is split into blank-line separated paragraphs, whitespace is normalised,
headings / grammar rules / code blocks / doctest lines / short fragments are
dropped, exact duplicates are removed and the first TARGET_ROWS are kept.

Deterministic for a given CPython + pyarrow version: no timestamps, fixed
order, pinned compression, fixed row-group size. Run from anywhere:

    python datasets/demo/build.py
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

OUT_DIR = Path(__file__).resolve().parent
TARGET_ROWS = 5000
MIN_TOPIC_ROWS = 4500  # below this, top up with stdlib docstrings
NUM_SHARDS = 5
ROW_GROUP_SIZE = 500
MIN_CHARS = 40
ID_PREFIX = "pydoc"

# Top-up sources, in this fixed order.
DOC_MODULES = (
    "os",
    "json",
    "pathlib",
    "collections",
    "itertools",
    "functools",
    "re",
    "asyncio",
    "email",
    "http",
    "urllib",
    "argparse",
    "logging",
    "typing",
    "datetime",
    "decimal",
    "statistics",
    "string",
    "textwrap",
    "shutil",
    "subprocess",
    "threading",
    "concurrent.futures",
    "contextlib",
    "dataclasses",
    "enum",
    "fractions",
    "heapq",
    "bisect",
    "random",
    "csv",
    "zipfile",
    "tarfile",
    "gzip",
    "hashlib",
    "socket",
    "selectors",
    "urllib.parse",
    "urllib.request",
    "http.client",
    "email.message",
    "unittest",
    "doctest",
    "inspect",
    "pickle",
    "copy",
    "abc",
    "io",
    "tempfile",
    "glob",
    "fnmatch",
    "difflib",
    "calendar",
    "locale",
    "gettext",
    "sqlite3",
    "xml.etree.ElementTree",
    "operator",
    "weakref",
    "types",
    "traceback",
    "warnings",
    "pdb",
    "timeit",
    "builtins",
    "sys",
    "math",
    "cmath",
    "time",
    "struct",
    "array",
    "queue",
    "sched",
    "codecs",
    "unicodedata",
    "pprint",
    "reprlib",
    "numbers",
    "ast",
    "dis",
    "tokenize",
    "configparser",
    "optparse",
    "shlex",
    "cmd",
    "base64",
    "binascii",
    "uuid",
    "ipaddress",
    "secrets",
    "hmac",
    "zlib",
    "bz2",
    "lzma",
    "platform",
    "trace",
    "pstats",
    "graphlib",
    "zoneinfo",
    "html.parser",
    "xml.dom.minidom",
    "socketserver",
    "http.server",
    "http.cookiejar",
    "importlib",
    "pkgutil",
    "runpy",
    "filecmp",
    "stat",
    "fileinput",
    "linecache",
    "mailbox",
    "smtplib",
    "imaplib",
    "ftplib",
    "plistlib",
)

_HEADING_RULE = re.compile(r"^\s*([*=\-~^\"'#+])\1{2,}\s*$")
_CODE_START = (">>>", "...", "$ ", "% ", "#!")
_CODE_LINE = re.compile(
    r"^\s*(?:(?:if|elif|else|for|while|with|try|except\*?|finally|async\s+\w+)\b.*:$|"
    r"(?:def|class)\s+\w+\s*[(:\[]|from\s+[\w.]+\s+import\s|import\s+[\w.]+$|"
    r"return\s+\S+$|@\w+|[A-Za-z_][\w.\[\]'\"]*\s*[-+*/|&]?=\s*\S|#\s)"
)
_SENTENCE_END = re.compile(r"[.!?:;)\"'’”\]]$")
_BULLET = re.compile(r"^(?:[*\-•]|\d+\.|\(\d+\))\s+")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _wordy(word: str) -> bool:
    letters = sum(c.isalpha() for c in word)
    return letters >= 2 and letters * 2 >= len(word)


def _is_prose(lines: list[str], text: str, strict: bool = False) -> bool:
    """Heuristic: keep English prose, drop code, grammar, headings, tables.

    ``strict`` is used for blocks in a literal-block position (indented under
    a paragraph ending in ':'), where code is likely.
    """
    if len(text) < MIN_CHARS:
        return False
    stripped = [ln.strip() for ln in lines]
    if any(s.startswith(_CODE_START) for s in stripped):
        return False
    if any(_HEADING_RULE.match(ln) for ln in lines):
        return False
    if "::=" in text:  # grammar productions
        return False
    if any(set(s) <= set("+-=| ") for s in stripped):  # ascii tables
        return False
    if any(_CODE_LINE.match(s) for s in stripped):
        return False
    if not _SENTENCE_END.search(text):
        return False
    words = text.split()
    if len(words) < 6:
        return False
    if sum(map(_wordy, words)) / len(words) < (0.8 if strict else 0.6):
        return False
    symbols = sum(text.count(c) for c in "{}[]=<>\\|@#$%")
    if symbols / len(text) > (0.03 if strict else 0.06):
        return False
    if strict and not re.search(r"[a-z]{3,}[.?!]$|[.?!][\"')”’]$", text):
        return False
    return True


def paragraphs(doc: str) -> list[str]:
    """Split rendered doc text into prose paragraphs (whitespace-normalised).

    A block indented deeper than a preceding paragraph that ends with ':' is in
    reST literal-block position and must pass a stricter prose test; blocks
    that fail it do not reset that context (multi-block code samples).
    """
    out: list[str] = []
    prev_indent = 0
    prev_colon = False
    for block in re.split(r"\n[ \t]*\n", doc.expandtabs(8)):
        lines = [ln.rstrip() for ln in block.split("\n") if ln.strip()]
        if not lines:
            continue
        ind = min(_indent(ln) for ln in lines)
        text = " ".join(" ".join(ln.split()) for ln in lines)
        text = _BULLET.sub("", text)
        in_literal = prev_colon and ind > prev_indent
        keep = _is_prose(lines, text, strict=in_literal)
        if in_literal and not keep:
            continue
        prev_indent, prev_colon = ind, text.endswith(":")
        if keep:
            out.append(text)
    return out


def topic_docs():
    from pydoc_data.topics import topics

    for key in sorted(topics):
        yield key, topics[key]


def _own_doc(obj) -> str | None:
    doc = getattr(obj, "__doc__", None)
    if not isinstance(doc, str) or not doc.strip():
        return None
    return inspect.cleandoc(doc)


def _defined_in(obj, modname: str) -> bool:
    """True if obj belongs to modname (or its C accelerator), not a re-export."""
    owner = (getattr(obj, "__module__", None) or "").lstrip("_")
    if modname == "os" and owner == "posix":
        return True
    return owner == modname or owner.startswith(modname + ".")


def module_docs():
    seen_objs: set[int] = set()
    for modname in DOC_MODULES:
        mod = importlib.import_module(modname)
        doc = _own_doc(mod)
        if doc:
            yield modname, doc
        public = getattr(mod, "__all__", None)
        if public:
            names = sorted(set(public))
        else:
            names = sorted(n for n in vars(mod) if not n.startswith("_"))
        classes = []
        for name in names:
            obj = getattr(mod, name, None)
            if not (inspect.isclass(obj) or inspect.isroutine(obj)):
                continue
            if id(obj) in seen_objs or not (public or _defined_in(obj, modname)):
                continue
            seen_objs.add(id(obj))
            doc = _own_doc(obj)
            if doc:
                yield f"{modname}.{name}", doc
            if inspect.isclass(obj):
                classes.append((name, obj))
        for cname, cls in classes:
            for mname in sorted(vars(cls)):
                if mname.startswith("_"):
                    continue
                meth = vars(cls)[mname]
                if isinstance(meth, (staticmethod, classmethod)):
                    meth = meth.__func__
                if not (inspect.isroutine(meth) or isinstance(meth, property)):
                    continue
                doc = _own_doc(meth)
                if doc:
                    yield f"{modname}.{cname}.{mname}", doc


def collect() -> tuple[list[tuple[str, str]], int]:
    """Return (rows as (source, text), number of rows from pydoc_data.topics)."""
    seen: set[str] = set()
    rows: list[tuple[str, str]] = []

    def add(source: str, doc: str) -> bool:
        for para in paragraphs(doc):
            if para in seen:
                continue
            seen.add(para)
            rows.append((source, para))
            if len(rows) >= TARGET_ROWS:
                return True
        return False

    for key, doc in topic_docs():
        if add(key, doc):
            break
    n_topic = len(rows)
    if n_topic < MIN_TOPIC_ROWS:
        for source, doc in module_docs():
            if add(source, doc):
                break
    return rows, n_topic


def main() -> None:
    rows, n_topic = collect()
    n = len(rows)
    ids = [f"{ID_PREFIX}-{i:06d}" for i in range(1, n + 1)]
    schema = pa.schema([("id", pa.string()), ("text", pa.string()), ("source", pa.string())])
    per_shard = -(-n // NUM_SHARDS)
    for s in range(NUM_SHARDS):
        lo, hi = s * per_shard, min(n, (s + 1) * per_shard)
        table = pa.table(
            {
                "id": ids[lo:hi],
                "text": [t for _, t in rows[lo:hi]],
                "source": [src for src, _ in rows[lo:hi]],
            },
            schema=schema,
        )
        pq.write_table(
            table,
            OUT_DIR / f"part-{s:04d}.parquet",
            row_group_size=ROW_GROUP_SIZE,
            compression="zstd",
            compression_level=3,
            version="2.6",
            use_dictionary=True,
            write_statistics=True,
        )
    print(
        f"python {sys.version.split()[0]}, pyarrow {pa.__version__}: "
        f"{n} rows ({n_topic} from pydoc_data.topics, {n - n_topic} from docstrings) "
        f"-> {NUM_SHARDS} shards in {OUT_DIR}"
    )


if __name__ == "__main__":
    main()
