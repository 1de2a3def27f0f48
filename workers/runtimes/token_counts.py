"""Token counts after truncation, as every runtime's tokenizer gives them, and texts tokenized once.

Counting asks for one token past the limit, so a text cut at the limit and a
text exactly at it are told apart: the first is counted as truncated.
"""

from __future__ import annotations

import numpy as np


def count_tokens(tokenizer, limit: int, texts: list[str], pairs: list[str] | None = None) -> tuple[np.ndarray, int]:
    """Tokens per text (or per (text, pair) when `pairs` is given), and how many were truncated."""
    ids = tokenizer(
        texts,
        pairs,
        add_special_tokens=True,
        truncation="longest_first" if pairs is not None else True,
        max_length=limit + 1,
        return_attention_mask=False,
        return_token_type_ids=False,
    )["input_ids"]
    raw = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    return np.minimum(raw, limit), int((raw > limit).sum())


class Tokens(tuple[np.ndarray, int]):
    """A text list tokenized once: as `Measured` (lengths after truncation, truncated count) with the ids kept.

    The lengths plan the batches and the ids are the forward's input, so no text is tokenized twice.
    """

    ids: list[list[int]]
    type_ids: list[list[int]]
    cut: np.ndarray  # per input: whether it was truncated

    def __new__(cls, ids: list[list[int]], type_ids: list[list[int]], cut: np.ndarray) -> Tokens:
        lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
        tokens = super().__new__(cls, (lengths, int(cut.sum())))
        tokens.ids, tokens.type_ids, tokens.cut = ids, type_ids, cut
        return tokens

    def part(self, start: int, end: int) -> Tokens:
        """Inputs [start, end)."""
        return Tokens(self.ids[start:end], self.type_ids[start:end], self.cut[start:end])


class TokenEncoder:
    """A private copy of a fast tokenizer's Rust backend, truncating at the model's window, never padding.

    Its own copy, set once: transformers sets truncation and padding on its backend per call, and a call
    there while this one encodes in the tokenizer thread would race on that state. `encode` releases the
    GIL (the Rust tokenizer), so it runs beside the forward.
    """

    def __init__(self, backend, limit: int, pad_id: int, pad_type_id: int, truncation_side: str) -> None:
        from tokenizers import Tokenizer

        self.backend = Tokenizer.from_str(backend.to_str())
        self.backend.no_padding()
        self.backend.enable_truncation(limit, strategy="longest_first", direction=truncation_side)
        self.pad_id, self.pad_type_id = pad_id, pad_type_id

    @classmethod
    def of(cls, tokenizer, limit: int) -> TokenEncoder | None:
        """For a transformers fast tokenizer or a GraphTokenizer that pads on the right; None for any other."""
        settings = getattr(tokenizer, "settings", None)  # a GraphTokenizer's: what transformers would set
        if settings is not None:
            backend, pad_id, pad_type_id = tokenizer.backend, settings.pad_id, settings.pad_type_id
            padding_side, truncation_side = settings.padding_side, settings.truncation_side
        else:
            backend = tokenizer._tokenizer if getattr(tokenizer, "is_fast", False) else None
            pad_id, pad_type_id = tokenizer.pad_token_id, tokenizer.pad_token_type_id
            padding_side, truncation_side = tokenizer.padding_side, tokenizer.truncation_side
        if backend is None or pad_id is None or padding_side != "right":
            return None
        return cls(backend, limit, int(pad_id), int(pad_type_id or 0), truncation_side)

    def encode(self, texts: list[str], pairs: list[str] | None = None) -> Tokens:
        batch = list(zip(texts, pairs)) if pairs is not None else texts
        encodings = self.backend.encode_batch(batch, add_special_tokens=True)
        cut = np.fromiter((bool(e.overflowing) for e in encodings), dtype=bool, count=len(encodings))
        return Tokens([e.ids for e in encodings], [e.type_ids for e in encodings], cut)

    def pad(self, tokens: Tokens, batch: np.ndarray) -> dict[str, np.ndarray]:
        """The batch's int64 input_ids, token_type_ids and attention_mask, padded on the right to its longest."""
        lengths = tokens[0][batch]
        width = int(lengths.max()) if len(batch) else 0
        ids = np.full((len(batch), width), self.pad_id, dtype=np.int64)
        type_ids = np.full((len(batch), width), self.pad_type_id, dtype=np.int64)
        mask = np.arange(width) < lengths[:, None]
        for row, i in enumerate(batch):
            n = int(lengths[row])
            ids[row, :n] = tokens.ids[i]
            type_ids[row, :n] = tokens.type_ids[i]
        return {"input_ids": ids, "token_type_ids": type_ids, "attention_mask": mask.astype(np.int64)}
