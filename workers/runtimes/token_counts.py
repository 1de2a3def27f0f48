"""Token counts after truncation, as every runtime's tokenizer gives them.

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
