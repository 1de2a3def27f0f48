"""The model's tokenizer on an ONNX worker: its ``tokenizer.json`` through the `tokenizers` library alone.

transformers' AutoTokenizer imports torch (about 1.3 s and a few hundred MB
per worker process), which an ONNX worker otherwise never needs. The export
(onnx_export) saves the model's fast tokenizer beside the graph, with the
settings transformers applies on each call (pad token, padding and truncation
sides); this class applies them as transformers' fast tokenizers do (set the
backend's truncation and padding, then ``encode_batch``), so ids, counts,
offsets and word ids are those the torch runtimes see. It answers the calls
Shoal makes of a tokenizer (workers/runtimes/token_counts.py, workers/data/chunking.py, the
graph's inputs), on lists of texts, not the whole of transformers' API.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tokenizers import Encoding

TOKENIZER_FILE = "tokenizer.json"
# What a graph may take, in transformers' names; a tokenizer's model_input_names says which it gives.
GRAPH_INPUTS = ("input_ids", "token_type_ids", "attention_mask")


@dataclass(frozen=True)
class TokenizerSettings:
    """What transformers sets on the backend per call, read off the model's tokenizer at export."""

    pad_token: str | None
    pad_id: int | None
    pad_type_id: int
    padding_side: str
    truncation_side: str

    @classmethod
    def of(cls, tokenizer) -> TokenizerSettings:
        """From a transformers tokenizer."""
        return cls(
            pad_token=None if tokenizer.pad_token is None else str(tokenizer.pad_token),
            pad_id=tokenizer.pad_token_id,
            pad_type_id=int(tokenizer.pad_token_type_id),
            padding_side=tokenizer.padding_side,
            truncation_side=tokenizer.truncation_side,
        )


# One field of a call's result: a row per text, as lists, or as one padded int64 array (return_tensors="np").
EncodedField = list[list[int]] | list[list[tuple[int, int]]] | np.ndarray


class Encoded(dict[str, EncodedField]):
    """A call's result: transformers' BatchEncoding as far as Shoal reads it (its fields, word ids per text)."""

    def __init__(self, fields: dict[str, EncodedField], encodings: list[Encoding]) -> None:
        super().__init__(fields)
        self.encodings = encodings

    def word_ids(self, index: int) -> list[int | None]:
        return self.encodings[index].word_ids


class GraphTokenizer:
    """The backend tokenizer with transformers' per-call settings; one call at a time (they are its state)."""

    is_fast = True  # offsets and word ids: chunking works on ONNX workers too

    def __init__(self, path: Path, settings: TokenizerSettings) -> None:
        from tokenizers import Tokenizer

        self.backend = Tokenizer.from_file(str(path))
        self.settings = settings
        self._lock = threading.Lock()

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        return self.backend.num_special_tokens_to_add(pair)

    def __call__(
        self,
        text: list[str],
        text_pair: list[str] | None = None,
        *,
        add_special_tokens: bool = True,
        truncation: bool | str = False,
        max_length: int | None = None,
        padding: bool = False,
        return_offsets_mapping: bool = False,
        return_attention_mask: bool = True,
        return_token_type_ids: bool = True,
        return_tensors: str | None = None,
        verbose: bool = True,
    ) -> Encoded:
        """Token ids (and masks, offsets) of `text`, or of the pairs (`text`, `text_pair`), one row per text.

        `truncation`: True or "longest_first", "only_first", "only_second", with `max_length`; `padding`: to
        the longest row; `return_tensors`: None (lists) or "np".
        """
        strategy = "longest_first" if truncation is True else truncation
        if strategy in (False, "do_not_truncate"):
            limit = None
        elif max_length is None:
            raise ValueError("truncation needs max_length")
        else:
            limit = max_length
        if padding and self.settings.pad_id is None:
            raise ValueError("this tokenizer has no padding token, so it cannot pad")
        if return_tensors not in (None, "np"):
            raise ValueError(f"return_tensors={return_tensors!r}: only None or 'np'")
        batch = list(zip(text, text_pair)) if text_pair is not None else list(text)
        with self._lock:
            if limit is None:
                self.backend.no_truncation()
            else:
                self.backend.enable_truncation(limit, strategy=strategy, direction=self.settings.truncation_side)
            if not padding:
                self.backend.no_padding()
            else:
                self.backend.enable_padding(
                    direction=self.settings.padding_side,
                    pad_id=self.settings.pad_id,
                    pad_type_id=self.settings.pad_type_id,
                    pad_token=self.settings.pad_token,
                )
            encodings = self.backend.encode_batch(batch, add_special_tokens=add_special_tokens)
        fields: dict[str, EncodedField] = {"input_ids": [e.ids for e in encodings]}
        if return_token_type_ids:
            fields["token_type_ids"] = [e.type_ids for e in encodings]
        if return_attention_mask:
            fields["attention_mask"] = [e.attention_mask for e in encodings]
        if return_tensors == "np":
            fields = {name: np.asarray(rows, dtype=np.int64) for name, rows in fields.items()}
        if return_offsets_mapping:
            fields["offset_mapping"] = [e.offsets for e in encodings]
        return Encoded(fields, encodings)

    def graph_inputs(
        self, names: list[str], max_length: int, first: list[str], second: list[str] | None = None
    ) -> dict[str, np.ndarray]:
        """What a graph with inputs `names` takes: the padded, truncated int64 arrays of `first` (or the pairs)."""
        encoded = self(
            first, second, truncation="longest_first", max_length=max_length, padding=True, return_tensors="np"
        )
        return {name: np.asarray(encoded[name]) for name in names}  # arrays already: no copy
