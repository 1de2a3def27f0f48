"""Token counts after truncation, as every runtime's tokenizer gives them, and texts tokenized once.

Counting asks for one token past the limit, so a text cut at the limit and a
text exactly at it are told apart: the first is counted as truncated.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .text_prefixes import PrefixCut

MIN_SHARE = 64  # texts per thread at least: a short list (an online group) tokenizes on the calling thread


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
    GIL (the Rust tokenizer), so it runs beside the forward, and a long list splits over `threads` threads.
    """

    def __init__(
        self, backend, limit: int, pad_id: int, pad_type_id: int, truncation_side: str, threads: int = 1
    ) -> None:
        from tokenizers import Tokenizer

        self.backend = Tokenizer.from_str(backend.to_str())
        self.backend.no_padding()
        self.backend.enable_truncation(limit, strategy="longest_first", direction=truncation_side)
        self.pad_id, self.pad_type_id = pad_id, pad_type_id
        self.prefix_cut = PrefixCut.of(self.backend, limit, truncation_side)  # None: texts tokenize whole
        self.threads = threads
        # The threads beside the calling one (a pool starts its threads on the first long list, not here).
        self._pool = ThreadPoolExecutor(threads - 1, thread_name_prefix="shoal-tokenize-share") if threads > 1 else None

    @classmethod
    def of(cls, tokenizer, limit: int, threads: int = 1) -> TokenEncoder | None:
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
        return cls(backend, limit, int(pad_id), int(pad_type_id or 0), truncation_side, threads)

    def encode(self, texts: list[str], pairs: list[str] | None = None) -> Tokens:
        """Ids truncated at the window, in order; a long list in even shares of characters, one per thread."""
        spans = self._spans(texts, pairs)
        if len(spans) == 1:
            encodings = self._encodings(texts, pairs)
        else:
            assert self._pool is not None  # more than one share: more than one thread
            rest = [
                self._pool.submit(self._encodings, texts[a:b], None if pairs is None else pairs[a:b])
                for a, b in spans[1:]
            ]
            (a, b) = spans[0]
            encodings = self._encodings(texts[a:b], None if pairs is None else pairs[a:b])
            for share in rest:
                encodings += share.result()
        cut = np.fromiter((bool(e.overflowing) for e in encodings), dtype=bool, count=len(encodings))
        return Tokens([e.ids for e in encodings], [e.type_ids for e in encodings], cut)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)

    def _spans(self, texts: list[str], pairs: list[str] | None) -> list[tuple[int, int]]:
        """[start, end) of each thread's share: about equal characters to tokenize, at least MIN_SHARE texts each."""
        shares = min(self.threads, len(texts) // MIN_SHARE)
        if shares <= 1:
            return [(0, len(texts))]
        most = self.prefix_cut.chars if self.prefix_cut is not None and pairs is None else None  # of a long text
        sizes = np.fromiter((min(len(t), most or len(t)) for t in texts), dtype=np.int64, count=len(texts))
        if pairs is not None:
            sizes += np.fromiter((len(t) for t in pairs), dtype=np.int64, count=len(pairs))
        bounds = np.searchsorted(np.cumsum(sizes), np.arange(1, shares) * (int(sizes.sum()) / shares))
        edges = [0, *sorted({int(x) + 1 for x in bounds if 0 <= int(x) + 1 < len(texts)}), len(texts)]
        return list(zip(edges, edges[1:]))

    def _encodings(self, texts: list[str], pairs: list[str] | None) -> list:
        """A long single text by its prefix where that is exact (text_prefixes); pairs whole."""
        if pairs is not None:
            return self._encode(list(zip(texts, pairs)))
        if self.prefix_cut is None:
            return self._encode(texts)
        prefixes, cut_at = self.prefix_cut.prefixes(texts)
        encodings = self._encode(prefixes)
        whole = [i for i in cut_at if not encodings[i].overflowing]  # the prefix fits: the text may too
        for i, encoding in zip(whole, self._encode([texts[i] for i in whole])):
            encodings[i] = encoding
        return encodings

    def _encode(self, batch: list) -> list:
        """Encodings without character offsets (nothing here reads them: a sixth less of the tokenizer's time)."""
        return self.backend.encode_batch_fast(batch, add_special_tokens=True) if batch else []

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
