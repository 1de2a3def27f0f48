"""A large online request as parts that the workers batch as usual, answered in input order.

A request may hold 2,048 texts (OpenAI's limit per call) or 10,000 documents
(Cohere's), more than one model call of a worker's online group is meant to
take: an online pull leases requests of up to a model's `online_batch`
inputs in all, about a forward batch's worth. The gateway splits a larger
request into parts of at most `online_batch` inputs, each an online item of
its own: the parts queue as one flow (the queue's fair share of one
request, scheduler_plugins/model_queues.py: they interleave with other
requests instead of going first in a block), go to whichever workers pull
them (one part a pull, so idle workers share a large request), are leased
and retried alone, and their answers are joined in input order. A request holds at most
`GatewaySettings.max_inputs_in_flight` inputs queued or computing at once:
its further parts wait in the gateway until earlier ones are answered. A part that gets
an error makes it the request's answer, and the parts not answered yet are
withdrawn from the queue.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Coroutine
from typing import Any, cast

from ..protocol import OnlinePayload, OnlineResult

# Where a payload's inputs are: an image model's images, encode's and the kind routes' texts, score's documents.
INPUT_FIELDS = ("images", "texts", "documents")
# An answer's per-input lists (score's scores, the kind routes' outputs), joined in order.
LIST_FIELDS = ("scores", "outputs")

# answer(part, inputs, flow): `flow` names the request the part belongs to (None: a request in one part).
AnswerPart = Callable[[OnlinePayload, int, str | None], Coroutine[Any, Any, OnlineResult]]

_FLOWS = itertools.count()


def _inputs(payload: OnlinePayload) -> tuple[str, list[Any]]:
    fields = cast(dict[str, Any], payload)
    field = next(name for name in INPUT_FIELDS if name in fields)
    return field, fields[field]


def split(payload: OnlinePayload, size: int) -> list[OnlinePayload]:
    """`payload` as parts of at most `size` inputs, in order; the other fields go with each part, and
    `first_input`, where the part starts (a worker's error names an input by its index in the request)."""
    field, inputs = _inputs(payload)
    if len(inputs) <= size:
        return [payload]
    return [
        cast(OnlinePayload, {**payload, field: inputs[i : i + size], "first_input": i})
        for i in range(0, len(inputs), size)
    ]


def join(results: list[OnlineResult]) -> OnlineResult:
    """The parts' answers as one: vectors stacked, lists joined, tokens added, the slowest part's timing."""
    if len(results) == 1:
        return results[0]
    first = results[0]
    joined: OnlineResult = {"tokens": sum(result.get("tokens", 0) for result in results)}
    if "embeddings" in first:
        joined["embeddings"] = b"".join(result["embeddings"] for result in results)
        joined["shape"] = [sum(result["shape"][0] for result in results), *first["shape"][1:]]
        joined["dtype"] = first["dtype"]
    lists = cast(dict[str, list[Any]], joined)
    for field in LIST_FIELDS:
        if field in first:
            lists[field] = [value for result in results for value in cast(dict[str, list[Any]], result)[field]]
    timings = [result["timing"] for result in results if "timing" in result]
    if timings:
        joined["timing"] = {stage: max(timing[stage] for timing in timings) for stage in timings[0]}
    return joined


async def answer_in_parts(
    answer: AnswerPart, payload: OnlinePayload, size: int, in_flight: int | None = None
) -> OnlineResult:
    """`payload` answered by `answer(part, inputs, flow)` for each part of at most `size` inputs, with at most
    `in_flight` inputs (whole parts, one at least) asked at once.

    The first error is the answer; the parts still waiting are then
    cancelled, which withdraws their items (as for a client that left).
    """
    parts = split(payload, size)
    if len(parts) == 1:
        return await answer(payload, len(_inputs(payload)[1]), None)
    flow = f"parts-{next(_FLOWS)}"
    window = asyncio.Semaphore(max(1, (in_flight or len(parts) * size) // size))  # wakes its waiters in order

    async def answer_part(part: OnlinePayload) -> OnlineResult:
        async with window:
            return await answer(part, len(_inputs(part)[1]), flow)

    tasks = [asyncio.create_task(answer_part(part)) for part in parts]  # queued in order
    try:
        for next_answer in asyncio.as_completed(tasks):
            result = await next_answer
            if "error" in result:
                return result
        return join([task.result() for task in tasks])
    finally:
        for task in tasks:
            task.cancel()
