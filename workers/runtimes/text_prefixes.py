"""A long text tokenized by its prefix alone, where that gives the very ids of the whole text truncated.

Truncating at the model's window, a 5,000-character text is tokenized whole
and all but its first few hundred tokens are thrown away. Cut just before a
space that follows a non-space, a text's prefix tokenizes to the whole text's
first tokens: the normalizer maps characters one by one, the pre-tokenizer
ends a piece at that space, and the model tokenizes each piece alone, so
nothing after the space changes a token before it. When the prefix alone
overflows the window, its truncated ids are the whole text's, and the whole
text overflows too; when it does not, the caller tokenizes the whole text.

Which tokenizers that holds for is read off their pipeline (`PrefixCut.of`):
the normalizers and pre-tokenizers known to be local at a space, and added
tokens without one. Any other (a regex ``Split`` or ``Replace``,
SentencePiece's precompiled character map, BPE dropout, truncation from the
left) is refused: its texts are tokenized whole.
"""

from __future__ import annotations

import json
import re
from typing import Any

# Characters of prefix per token of the window: English runs at 3-5 characters per WordPiece token, so a
# prefix this long nearly always overflows; one that does not (whitespace-heavy code) costs a second call.
CHARS_PER_TOKEN = 6
_CUT = re.compile(r"\S ")  # a prefix ends just before a space that follows a non-space

# Normalizers that map each character alone (a space stays one character; Unicode forms reorder and
# compose only between spaces), so a text normalizes as its prefix does followed by the rest; Prepend
# changes only the start, where prefix and text agree. (Not Strip: a prefix may normalize to end in spaces.)
_LOCAL_NORMALIZERS = {"BertNormalizer", "Lowercase", "NFC", "NFD", "NFKC", "NFKD", "StripAccents", "Prepend"}
# Pre-tokenizers that end a piece at a space after a non-space, whatever follows it (ByteLevel: GPT-2's
# regex, whose every alternative either holds no space or is all spaces).
_SPLIT_AT_SPACE = {"BertPreTokenizer", "Whitespace", "WhitespaceSplit", "ByteLevel", "Metaspace"}
# Pre-tokenizers that only cut the pieces they get further, by character class: safe after a split at spaces.
_SPLIT_FURTHER = {"Punctuation", "Digits"}
_PER_PIECE_MODELS = {"WordPiece", "BPE", "Unigram", "WordLevel"}


class PrefixCut:
    """Where to cut long texts before tokenizing them, for one tokenizer and window."""

    def __init__(self, chars: int) -> None:
        self.chars = chars  # texts longer than this are cut, at the first space past it

    @classmethod
    def of(cls, backend: Any, limit: int, truncation_side: str) -> PrefixCut | None:
        """For a `tokenizers.Tokenizer` truncating at `limit` tokens; None where a prefix is not provably exact."""
        if truncation_side != "right":
            return None  # truncation keeps the text's end
        return cls(limit * CHARS_PER_TOKEN) if refusal(json.loads(backend.to_str())) is None else None

    def prefixes(self, texts: list[str]) -> tuple[list[str], list[int]]:
        """The texts with each long one cut to its prefix, and the indices of those cut."""
        cut: list[int] = []
        out = list(texts)
        for i, text in enumerate(texts):
            if len(text) > self.chars:
                found = _CUT.search(text, self.chars)
                if found is not None:
                    out[i] = text[: found.start() + 1]
                    cut.append(i)
        return out, cut


def refusal(tokenizer: dict[str, Any]) -> str | None:
    """Why a prefix of a text may tokenize otherwise than the text's head, for a tokenizer's JSON; None: it cannot."""
    space = " "  # what a space in the text becomes after the normalizer
    normalizer = tokenizer.get("normalizer")
    for step in _steps(normalizer, "normalizers"):
        kind = step.get("type")
        if kind == "Replace":
            pattern, content = step.get("pattern", {}).get("String"), step.get("content", "")
            if pattern is None or len(pattern) != 1:
                return "a Replace normalizer whose pattern is not one character"
            if pattern == space:
                if len(content) != 1:
                    return "a Replace normalizer that makes a space more or less than one character"
                space = content
        elif kind not in _LOCAL_NORMALIZERS:
            return f"normalizer {kind}"
    steps = _steps(tokenizer.get("pre_tokenizer"), "pretokenizers")
    if not steps or not _splits_at(steps[0], space):
        return "no pre-tokenizer that ends a piece at a space first"
    for step in steps[1:]:
        if step.get("type") not in _SPLIT_AT_SPACE | _SPLIT_FURTHER:
            return f"pre-tokenizer {step.get('type')}"
    model = tokenizer.get("model", {})
    if model.get("type") not in _PER_PIECE_MODELS or model.get("dropout"):
        return f"model {model.get('type')} (dropout {model.get('dropout')})"
    for added in tokenizer.get("added_tokens") or []:
        content = added.get("content", "")
        if any(c.isspace() for c in content) or space in content:
            return f"added token {content!r} holds a space"
    return None


def _steps(part: dict[str, Any] | None, members: str) -> list[dict[str, Any]]:
    """A normalizer's or pre-tokenizer's steps in order: a Sequence's members, flattened; [] for none."""
    if part is None:
        return []
    if part.get("type") == "Sequence":
        return [step for member in part.get(members, []) for step in _steps(member, members)]
    return [part]


def _splits_at(step: dict[str, Any], space: str) -> bool:
    """Whether this pre-tokenizer ends a piece at `space` (a normalized space) that follows a non-space."""
    kind = step.get("type")
    if kind == "Metaspace":
        return step.get("split", True) and space in (" ", step.get("replacement", "\u2581"))
    if kind == "ByteLevel":
        return step.get("use_regex", True) and space == " "
    return kind in _SPLIT_AT_SPACE and space == " "
