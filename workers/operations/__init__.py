"""The operations a work item may name, and the stages each one has.

A batch operation (`BatchOperation`) is a module with three functions, run by
the pull loop in this order so storage work overlaps the model:

- ``read(payload) -> data``: in an I/O thread (storage reads, parsing)
- ``compute(runtime, data) -> computed``: on the device thread, with the
  item's model loaded
- ``write(payload, data, computed, spec) -> result``: in an I/O thread; the
  result is sent to the scheduler with the ack

mypy checks each module against the protocol where `OPERATIONS` names it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from shoal.configs import ModelSpec
from shoal.scheduler_plugins.protocol import ItemResult, OnlineResult
from shoal.workers.data.parquet_slices import InputError
from shoal.workers.data.storage import OutputRefused
from shoal.workers.model_pool import ModelTooLarge

from . import (
    classify_operation,
    embed_operation,
    extract_operation,
    image_operation,
    multivector_operation,
    online_operations,
    rerank_operation,
    sim_operation,
    sparse_operation,
)

P = TypeVar("P", contravariant=True)  # the payload
R = TypeVar("R", contravariant=True)  # the runtime
D = TypeVar("D")  # what `read` gives `compute` and `write`
C = TypeVar("C")  # what `compute` gives `write`


class BatchOperation(Protocol[P, R, D, C]):
    def read(self, payload: P) -> D: ...

    def compute(self, runtime: R, data: D) -> C: ...

    def write(self, payload: P, data: D, computed: C, spec: ModelSpec) -> ItemResult: ...


OPERATIONS: dict[str, BatchOperation[Any, Any, Any, Any]] = {
    "embed": embed_operation,
    "rerank": rerank_operation,
    "sparse": sparse_operation,
    "multivector": multivector_operation,
    "classify": classify_operation,
    "extract": extract_operation,
    "embed_images": image_operation,
    "sim": sim_operation,  # simulated runtime only: no storage (cluster experiments)
}

# Online operations take a whole group of requests of one model at once (see
# online_groups), on the device thread: ``op(runtime, payloads) -> results``,
# one result per payload.
OnlineOperation = Callable[[Any, list[Any]], list[OnlineResult]]
ONLINE_OPERATIONS: dict[str, OnlineOperation] = {
    "encode": online_operations.encode,
    "score": online_operations.score,
    "encode_sparse": sparse_operation.online,  # an online op's name is never a batch op's (pull_loop)
    "encode_multivector": multivector_operation.online,
    "label": classify_operation.online,
    "tag": extract_operation.online,
    "encode_images": image_operation.online,  # an image model's requests of images or of texts
}

# Failures no retry can fix: the item (or online request) goes to dead letters at once.
PERMANENT_ERRORS = (InputError, ModelTooLarge, OutputRefused)
