"""Limits before validation: a body is decoded within bounds, and each list field's size and elements are checked
before pydantic, naming the first wrong element (unit tests; tests/gateway/test_hostile_requests.py sends them over
HTTP)."""

from __future__ import annotations

import json

import msgpack
import pytest

from shoal.configs import GatewaySettings, ModelSpec
from shoal.scheduler_plugins.gateway import api_formats as api
from shoal.scheduler_plugins.gateway import body_limits, kind_routes
from shoal.scheduler_plugins.gateway.wire import JSON, MSGPACK, DecodeBounds, RequestError, clip, decode, shown

BOUNDS = DecodeBounds(values=100, containers=10, entries=20, strings=50, list_items=80, map_entries=8)
CLASSIFIER = ModelSpec(name="m", kind="classifier", dim=2, max_seq_length=16)  # the /v1/classify route's
LIMITS = GatewaySettings(max_inputs=4, max_documents=6, max_input_tokens=5, max_request_tokens=12)


def refusal(call, *args) -> RequestError:
    with pytest.raises(RequestError) as info:
        call(*args)
    return info.value


# -- decoding within bounds ------------------------------------------------------------------------------------


def test_json_commas_brackets_and_colons_inside_texts_do_not_count():
    texts = ['a, [b], {c: d}, \\"e, f\\"' * 40, 'quote " and backslash \\ ,,,,']
    body = json.dumps({"texts": texts}).encode()
    assert body.count(b",") > BOUNDS.values and body.count(b":") > BOUNDS.entries
    assert decode(body, JSON, BOUNDS) == {"texts": texts}


@pytest.mark.parametrize(
    "body,what",
    [
        ({"texts": [1] * 101}, "100 values"),
        ({"texts": [[]] * 11}, "10 lists and maps"),
        ({"texts": [{"a": 1}] * 9}, "10 lists and maps"),
        ({"texts": [{"a": 1, "b": 2, "c": 3}] * 7}, "20 map entries"),
        ({"texts": ["a"] * 120}, "50 strings"),  # over the values bound, and too many strings to recount
    ],
)
def test_a_json_body_over_a_bound_is_refused_before_it_is_decoded(body, what):
    error = refusal(decode, json.dumps(body).encode(), JSON, BOUNDS)
    assert error.status == 413 and f"more than {what}" in error.message


@pytest.mark.parametrize(
    "body,what",
    [
        ({"texts": [1] * 81}, "a list of 81 items; a list holds at most 80"),
        ({"texts": [[1] * 60, [1] * 60]}, "more than 100 values"),
        ({"texts": [[]] * 11}, "more than 10 lists and maps"),
        ({"texts": [{"a": 1, "b": 2, "c": 3}] * 7}, "more than 20 map entries"),
        ({f"f{i}": 1 for i in range(9)}, "a map of 9 entries; a map has at most 8"),
    ],
)
def test_messagepack_decoding_stops_at_the_first_bound_it_passes(body, what):
    error = refusal(decode, msgpack.packb(body), MSGPACK, BOUNDS)
    assert error.status == (400 if "a map of" in what else 413) and what in error.message


@pytest.mark.parametrize(
    "body,reason",
    [
        (b"\x91" * 5000 + b"\x01", "nested too deeply"),
        (b"\xc1", "0xc1, which MessagePack never uses"),
        (b"\x82\xa5texts\x91\xa1a", "truncated"),
        (b"\x81\x01\x91\xa1a", "a map key that is not a string"),
        (msgpack.packb([1]) + b"\x01", "bytes follow its first value"),
    ],
)
def test_bad_messagepack_says_why(body, reason):
    error = refusal(decode, body, MSGPACK, BOUNDS)
    assert error.status == 400 and reason in error.message


def test_json_nested_past_its_bounds_is_named_so():
    error = refusal(decode, b'{"texts": ' + b"[" * 5000 + b"]" * 5000 + b"}", JSON, BOUNDS)
    assert error.status == 400 and "nested too deeply (at least 5001 levels)" in error.message


def test_json_nan_and_deep_nesting_are_400s():
    assert "NaN is not a JSON number" in refusal(decode, b'{"dim": NaN}', JSON, BOUNDS).message
    assert (
        "nested too deeply"
        in refusal(decode, b"[" * 5000 + b"]" * 5000, JSON, DecodeBounds(10**5, 10**5, 10, 10, 10**5, 8)).message
    )


def test_the_decode_bounds_hold_the_largest_legal_bodies():
    bounds = body_limits.decode_bounds(GatewaySettings())
    largest = [
        {"model": "m", "input": [[100] * 146] * 2048},  # 299,008 token ids: just under max_request_tokens
        {"model": "m", "query": "q", "documents": [{"text": "d", "id": i, "title": "t"} for i in range(10_000)]},
        {"texts": ["a"], "precision": "int8", "ranges": [[0.0] * 65_536, [1.0] * 65_536]},
    ]
    for body in largest:
        for media, data in ((JSON, json.dumps(body).encode()), (MSGPACK, msgpack.packb(body))):
            assert decode(data, media, bounds) == body


# -- each field's limits before pydantic -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "call,body,status,message",
    [
        (api.encode_call, {"texts": ["a"] * 5}, 422, "5 texts; at most 4 per request"),
        (api.encode_call, {"texts": ["a", None]}, 400, "texts[1] is null, not a string"),
        (api.encode_call, {"texts": "a"}, 400, "texts must be a list of strings, not a string"),
        (api.encode_call, {"texts": ["a"], "ranges": [[1] * 70_000, [2] * 70_000]}, 422, "at most 65536"),
        (api.encode_call, {"texts": ["a"], "ranges": [[1, "x"], [2, 3]]}, 400, "ranges[0][1] is a string"),
        (api.encode_call, {"texts": ["a"], **{f"f{i}": 1 for i in range(65)}}, 400, "66 fields"),
        (api.encode_call, [1, 2], 400, "must be a map (an object), not a list"),
        (api.score_call, {"query": "q", "documents": ["d"] * 7}, 422, "7 documents; at most 6"),
        (api.cohere_call, {"model": "r", "query": "q", "documents": [1] * 7}, 422, "7 documents; at most 6"),
        (api.cohere_call, {"model": "r", "query": "q", "documents": ["a", {"txt": "b"}]}, 400, "documents[1] is a map"),
    ],
)
def test_list_fields_are_counted_then_checked_to_their_first_wrong_element(call, body, status, message):
    error = refusal(call, *(("m",) if call in (api.encode_call, api.score_call) else ()), body, LIMITS)
    assert error.status == status and message in error.message, error.message


@pytest.mark.parametrize(
    "given,status,message",
    [
        ([1] * 6, 422, "6 token ids in input; at most 5"),
        ([1, "x"], 400, "input[1] is a string, not a token id"),
        ([[1]] * 5, 422, "5 input; at most 4"),
        ([[1], []], 422, "input[1] holds 0 token ids; from 1 to 5"),
        ([[1] * 6], 422, "input[0] holds 6 token ids"),
        ([[1] * 5, [1] * 5, [1] * 5], 422, "15 token ids in input; at most 12"),
        ([[1], 2], 400, "input[1] is a number, not a token array"),
        (["a", 1], 400, "input[1] is a number, not a string"),
        ([True], 400, "input[0] is true, not a string"),
        ({"a": 1}, 400, "not a map"),
        ([], 422, "input is empty"),
    ],
)
def test_openai_input_is_checked_by_its_shape(given, status, message):
    error = refusal(api.openai_request, {"model": "m", "input": given}, LIMITS)
    assert error.status == status and message in error.message, error.message


def test_validation_lists_five_problems_and_counts_the_rest():
    error = refusal(api.encode_call, "m", {"texts": ["a"], **{f"f{i}": 1 for i in range(12)}}, LIMITS)
    assert error.message.count("Extra inputs are not permitted") == 5 and "(and 7 more)" in error.message


def test_a_client_string_is_quoted_to_200_characters():
    assert shown("x" * 10) == "'xxxxxxxxxx'"
    assert shown("m" * 10**6).startswith("'" + "m" * 200 + "'… (1000000 characters)")
    assert shown([1] * 10**6) == "a list of 1000000 items" and shown({"a": 1}) == "a map of 1 entries"
    assert clip("m" * 300) == "m" * 200 + "… (300 characters)"
    long_key = "k" * 10**6
    error = refusal(api.encode_call, "m", {"texts": ["a"], long_key: 1}, LIMITS)
    assert "k" * 201 not in error.message and "k" * 200 in error.message


@pytest.mark.parametrize("template", ["{:>999999999}", "{0}", "{} and {}", "{x}", "no field", "{", "{!r}"])
def test_a_zero_shot_template_is_one_bare_placeholder(template):
    body = {"texts": ["a"], "labels": ["x"], "template": template}
    error = refusal(kind_routes.texts_call, "m", body, CLASSIFIER, LIMITS)
    assert error.status == 400 and "template must be a string with {}" in error.message


def test_labels_are_counted_before_they_are_looked_at():
    error = refusal(kind_routes.texts_call, "m", {"texts": ["a"], "labels": [1] * 1000}, CLASSIFIER, LIMITS)
    assert "1000 labels; at most 64" in error.message


def test_json_documents_inside_texts_are_texts():
    """Texts that are JSON themselves (escaped quotes, braces, colons, commas): counted as texts, not structure."""
    inner = json.dumps({"key": [1, 2, {"nested": "value, with: commas"}], "other": {"a": "b"}})
    body = json.dumps({"texts": [inner] * 4}).encode()
    bounds = DecodeBounds(values=10, containers=3, entries=3, strings=6, list_items=10, map_entries=8)
    assert body.count(b"{") > bounds.containers and body.count(b'"') > 2 * bounds.strings
    assert decode(body, JSON, bounds) == {"texts": [inner] * 4}
