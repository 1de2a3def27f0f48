"""The operations a work item may name: each a module, found through the kinds' registry.

An operation's one name runs through everything: a job's items and an online
request's both name it (``embed``, ``rerank``, ``sparse``, ``multivector``,
``classify``, ``extract``; ``sim`` for the simulated runtime), and the kind
that computes it names its module (configs/kinds: `Kind.operations`). Whether
an item is a batch item or an online request is its lane (`Lane`), never its
operation's name.

A module's batch stages (`BatchOperation`) are run by the pull loop in this
order, so storage work overlaps the model:

- ``read(payload) -> data``: in an I/O thread (storage reads, parsing)
- ``compute(runtime, data) -> computed``: on the device thread, with the
  item's model loaded
- ``write(payload, data, computed, spec) -> result``: in an I/O thread; the
  result is sent to the scheduler with the ack

and ``online(runtime, payloads) -> results`` answers a whole group of online
requests of one model at once (see online_groups), on the device thread, one
result per payload. tests/kinds/test_registry.py checks every module the
registry names against these.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import cache
from typing import Any, Protocol, TypeVar, cast

from ...configs import ModelSpec
from ...configs.kinds import operation_module
from ...scheduler_plugins.protocol import ItemResult, OnlineResult
from ..data.parquet_slices import InputError
from ..data.storage import OutputRefused
from ..model_pool import ModelTooLarge

P = TypeVar("P", contravariant=True)  # the payload
R = TypeVar("R", contravariant=True)  # the runtime
D = TypeVar("D")  # what `read` gives `compute` and `write`
C = TypeVar("C")  # what `compute` gives `write`


class BatchOperation(Protocol[P, R, D, C]):
    def read(self, payload: P) -> D: ...

    def compute(self, runtime: R, data: D) -> C: ...

    def write(self, payload: P, data: D, computed: C, spec: ModelSpec) -> ItemResult: ...


OnlineOperation = Callable[[Any, list[Any]], list[OnlineResult]]


@cache
def operation(op: str) -> Any:
    """The module computing `op` (ValueError when no kind runs it)."""
    return importlib.import_module(operation_module(op))


def batch_operation(op: str) -> BatchOperation[Any, Any, Any, Any]:
    return cast(BatchOperation[Any, Any, Any, Any], operation(op))


def online_operation(op: str) -> OnlineOperation:
    """`op`'s answer to a group of online requests (ValueError when it has none)."""
    answer = getattr(operation(op), "online", None)
    if answer is None:
        raise ValueError(f"the operation {op!r} answers no online requests")
    return answer


# Failures no retry can fix: the item (or online request) goes to dead letters at once.
PERMANENT_ERRORS = (InputError, ModelTooLarge, OutputRefused)
