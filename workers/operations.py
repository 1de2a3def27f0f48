"""The operations a work item may name, and the stages each one has.

A batch operation is a module (or object) with three functions, run by the
pull loop in this order so storage work overlaps the model:

- ``read(payload) -> data``: in an I/O thread (storage reads, parsing)
- ``compute(runtime, data) -> computed``: on the device thread, with the
  item's model loaded
- ``write(payload, data, computed, spec) -> result``: in an I/O thread; the
  result dict is sent to the scheduler with the ack
"""

from __future__ import annotations

from . import embed_operation, online_operations, rerank_operation, sim_operation
from .model_pool import ModelTooLarge
from .parquet_slices import InputError
from .storage import OutputRefused

OPERATIONS = {
    "embed": embed_operation,
    "rerank": rerank_operation,
    "sim": sim_operation,  # simulated runtime only: no storage (cluster experiments)
}

# Online operations take a whole group of requests of one model at once (see
# online_groups), on the device thread: ``op(runtime, payloads) -> results``,
# one result per payload.
ONLINE_OPERATIONS = {
    "encode": online_operations.encode,
    "score": online_operations.score,
}

# Failures no retry can fix: the item (or online request) goes to dead letters at once.
PERMANENT_ERRORS = (InputError, ModelTooLarge, OutputRefused)
