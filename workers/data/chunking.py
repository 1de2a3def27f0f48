"""Chunking: texts longer than a window become overlapping token windows, not truncated ones.

A model sees at most ``max_seq_length`` tokens; a longer text is cut and the
rest never embedded. Indexing pipelines instead split each text into windows
of N tokens (counted with the model's own tokenizer, special tokens included,
so a window is exactly what the model reads) that overlap by K tokens, and
embed every window. Windows are cut at token boundaries and mapped back to
character offsets (a fast tokenizer's ``offset_mapping``), so each output
row can say which passage of the source it stands for: ``text[start:end]``.

The split runs on the worker, inside the item's compute, so the windows of a
whole item go through the runtime's token-budget batching together.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

SETTING = re.compile(r"^\s*(tokens|overlap)\s*=\s*(-?\d+)\s*$")


class ChunkSettings(BaseModel):
    """`tokens`: window length in tokens, the model's special tokens included; `overlap`: tokens shared by neighbours."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokens: int = Field(gt=0)
    overlap: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _overlap_below_tokens(self) -> ChunkSettings:
        if self.overlap >= self.tokens:
            raise ValueError(f"overlap ({self.overlap}) must be less than tokens ({self.tokens})")
        return self

    @classmethod
    def parse(cls, text: str) -> ChunkSettings:
        """`tokens=N[,overlap=K]`, as the command line takes it; ValueError saying what is wrong."""
        fields: dict[str, int] = {}
        for part in text.split(","):
            match = SETTING.match(part)
            if not match:
                raise ValueError(f"{part.strip()!r}: expected tokens=N or overlap=K")
            fields[match.group(1)] = int(match.group(2))
        if "tokens" not in fields:
            raise ValueError("tokens=N is required")
        return cls(**fields)

    def check_window(self, max_seq_length: int, model: str) -> None:
        if self.tokens > max_seq_length:
            raise ValueError(f"chunk tokens={self.tokens} is more than model {model!r} reads ({max_seq_length} tokens)")


@dataclass
class Windows:
    """Every window of a list of texts: which text, its index there, its characters, its text."""

    source: np.ndarray  # index of the text each window comes from
    chunk: np.ndarray  # 0, 1, … within its text
    start: np.ndarray  # character offsets into the text: text[start:end] is the window
    end: np.ndarray
    texts: list[str]


def token_windows(tokenizer, texts: list[str], settings: ChunkSettings) -> Windows:
    """Split each text into windows of at most `settings.tokens` tokens (specials included).

    Neighbouring windows share at least `overlap` tokens. Windows start and
    end at word boundaries (the tokenizer's ``word_ids``), so a window's text
    tokenizes back to the same tokens: cut inside a word, "constructor"
    would start a window as "tructor", more tokens than the window counted.
    Only a single word longer than a window is cut inside. A text that fits
    is one window, the whole text (0, len(text)), so short texts embed
    exactly as without chunking.
    """
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            f"chunking needs a fast (Rust) tokenizer for character offsets; {type(tokenizer).__name__} is not one"
        )
    content = settings.tokens - tokenizer.num_special_tokens_to_add(pair=False)
    if content <= settings.overlap:
        raise ValueError(
            f"chunk tokens={settings.tokens} leaves {content} tokens of text per window beside the model's "
            f"special tokens, not more than overlap={settings.overlap}"
        )
    encoded = tokenizer(
        texts,
        add_special_tokens=False,
        return_offsets_mapping=True,
        return_attention_mask=False,
        return_token_type_ids=False,
        verbose=False,
    )
    source, chunk, start, end, windows = [], [], [], [], []
    for index, text in enumerate(texts):
        spans = encoded["offset_mapping"][index]
        if len(spans) <= content:
            bounds = [(0, len(text))]
        else:
            bounds = [
                (spans[first][0], spans[last - 1][1])
                for first, last in _token_ranges(_word_starts(encoded.word_ids(index)), content, settings.overlap)
            ]
        for number, (lo, hi) in enumerate(bounds):
            source.append(index)
            chunk.append(number)
            start.append(lo)
            end.append(hi)
            windows.append(text[lo:hi])
    return Windows(
        source=np.asarray(source, dtype=np.int64),
        chunk=np.asarray(chunk, dtype=np.int64),
        start=np.asarray(start, dtype=np.int64),
        end=np.asarray(end, dtype=np.int64),
        texts=windows,
    )


def _word_starts(word_ids: list[int | None]) -> list[int]:
    """For each token, the index of the first token of its word."""
    starts: list[int] = []
    for i, word in enumerate(word_ids):
        starts.append(starts[i - 1] if i and word is not None and word == word_ids[i - 1] else i)
    return starts


def _token_ranges(word_start: list[int], content: int, overlap: int) -> list[tuple[int, int]]:
    """[first, last) token ranges of at most `content` tokens, overlapping by at least `overlap`, on word edges."""
    total, first, ranges = len(word_start), 0, []
    while True:
        last = min(first + content, total)
        if last < total and word_start[last] > first:  # do not end inside a word (unless one word fills the window)
            last = word_start[last]
        ranges.append((first, last))
        if last >= total:
            return ranges
        back = max(last - overlap, first + 1)
        first = word_start[back] if word_start[back] > first else back
