"""The online request options several kinds take, each checked one way: top_k, labels, threshold, multi_label.

A refused option is an `InvalidRequest` whose message the gateway answers with a 400.
"""

from __future__ import annotations

import math
import string

from .kind import Body, Fields, InvalidRequest

MAX_LABELS = 64  # labels per request: a zero-shot label is one forward row per text


def top_k(options: Body, fields: Fields) -> None:
    value = options.get("top_k")
    if value is not None:
        if type(value) is not int or value < 1:
            raise InvalidRequest("invalid request: top_k must be a positive integer, not {value}", value)
        fields["top_k"] = value


def labels_and_threshold(options: Body, fields: Fields) -> None:
    """`labels` (distinct non-empty strings) and `threshold` (a number)."""
    labels = options.get("labels")
    if labels is not None:
        if isinstance(labels, list) and len(labels) > MAX_LABELS:  # before looking at each
            raise InvalidRequest(f"invalid request: {len(labels)} labels; at most {MAX_LABELS} per request")
        if not isinstance(labels, list) or not labels or not all(isinstance(x, str) and x for x in labels):
            raise InvalidRequest("invalid request: labels must be a list of non-empty strings")
        if len(set(labels)) != len(labels):
            raise InvalidRequest(f"invalid request: labels must be distinct, {MAX_LABELS} at most")
        try:
            "".join(labels).encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidRequest("invalid request: labels must be valid UTF-8 text") from None
        fields["labels"] = labels
    threshold = options.get("threshold")
    if threshold is not None:
        if type(threshold) not in (int, float) or not math.isfinite(threshold):
            raise InvalidRequest("invalid request: threshold must be a number, not {value}", threshold)
        fields["threshold"] = float(threshold)


def multi_label(options: Body, fields: Fields) -> None:
    value = options.get("multi_label")
    if value is not None:
        if type(value) is not bool:
            raise InvalidRequest("invalid request: multi_label must be true or false, not {value}", value)
        fields["multi_label"] = value


def one_placeholder(template: str) -> bool:
    """One bare ``{}`` and no other field: a format spec (``{:>999999999}``) would build a string of its width."""
    try:
        fields = [(name, spec, conversion) for _, name, spec, conversion in string.Formatter().parse(template)]
    except ValueError:  # an unmatched brace
        return False
    return [field for field in fields if field[0] is not None] == [("", "", None)]


def tokens(result: dict) -> dict[str, int]:
    """A reply's usage: the tokens the workers read."""
    return {"tokens": result.get("tokens", 0)}
