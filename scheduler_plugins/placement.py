"""Which model a pulling worker should serve next.

The order: online items (resident models first), then batch items of models
already resident on the worker (oldest head first), then stealing: the model
whose backlog most justifies loading it on this worker. Workers pull, so a
model's work goes to whichever worker has room, not to where a router guessed.
"""

from __future__ import annotations

from collections.abc import Iterable

from .model_queues import ModelQueues
from .work_items import BATCH, ONLINE


def choose_model(
    queues: ModelQueues,
    resident: Iterable[str],
    can_host: Iterable[str] | None = None,
) -> tuple[str, int] | None:
    """(model, priority) for the pull, or None when nothing fits this worker.

    `can_host` limits stealing to models this worker may load (requirements
    against its resources); None means any model.
    """
    resident = set(resident)
    allowed = None if can_host is None else set(can_host)
    candidates = [m for m in queues.models() if allowed is None or m in allowed or m in resident]

    for priority in (ONLINE, BATCH):
        heads = []
        for model in candidates:
            head = queues.head(model, priority)
            if head is not None:
                heads.append((model not in resident, head.enqueued_at, model))
        if priority == ONLINE and heads:
            return min(heads)[2], ONLINE
        resident_heads = [h for h in heads if not h[0]]
        if resident_heads:
            return min(resident_heads)[2], priority
        if heads:
            # Steal: the largest waiting backlog is the load most worth paying for.
            model = max(heads, key=lambda h: (queues.waiting_rows(h[2]), -h[1]))[2]
            return model, priority
    return None
