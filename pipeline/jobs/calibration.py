"""int8/uint8 calibration: one set of ranges per job output, computed once from a sample and kept.

Quantizing to int8 maps each dimension's [min, max] onto 256 steps, so every
vector of one output must use the same ranges, whichever run, worker or
retry wrote its part. The ranges come from the job's first work item (its
float32 vectors, embedded by the cluster like any item, chunked if the job
is), are written to ``OUTPUT/_calibration.json`` before any part is, and are
copied into every item. A resumed run finds the file and reuses it (same
model fingerprint and options); a reindex into a new version computes its
own. The manifest records them too, for readers and for the online
endpoint (`ranges`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable

import pyarrow as pa
import pyarrow.parquet as pq

from ...scheduler_plugins.protocol import JobStatus, StorageOptions
from ...workers.data.storage import atomic_write, open_fs
from ...workers.data.vector_precision import VectorFormat, ranges_of
from .planner import PlanError, PlannedItem

CALIBRATION_NAME = "_calibration.json"
SAMPLE_NAME = "_calibration-sample.parquet"


def stored_ranges(
    output_url: str, storage_options: StorageOptions | None, key: dict[str, str]
) -> list[list[float]] | None:
    """The ranges an earlier run of the same job computed, if their key (fingerprint, options) matches."""
    fs, path = open_fs(f"{output_url.rstrip('/')}/{CALIBRATION_NAME}", storage_options)
    try:
        record = json.loads(fs.cat_file(path))
    except (FileNotFoundError, ValueError):
        return None
    return record["ranges"] if record.get("key") == key else None


def calibrate(
    items: list[PlannedItem],
    fmt: VectorFormat,
    output_url: str,
    storage_options: StorageOptions | None,
    key: dict[str, str],
    run_sample: Callable[[list[PlannedItem]], JobStatus],
) -> list[list[float]]:
    """Ranges from the first item's float32 vectors (the first with rows), stored beside the parts; PlanError if it has none.

    `run_sample(items)` runs work items on the cluster and returns the job status.
    """
    output_url = output_url.rstrip("/")
    sample = copy.deepcopy(next((item for item in items if item["rows"]), items[0]))  # not an unreadable shard's
    payload = sample["payload"]
    payload.pop("vectors", None)  # float32, full width: ranges_of shortens as the parts will
    payload.pop("lance", None)  # a Parquet part to read back, even when the job's rows go to Lance
    payload.pop("part_metadata", None)
    payload["part"], payload["output"] = SAMPLE_NAME, f"{output_url}/{SAMPLE_NAME}"
    status = run_sample([sample])
    if status["dead_letters"]:
        errors = status["dead_letters"][0]["errors"]
        raise PlanError(
            f"{fmt.precision} calibration: the sample item ({payload['input']}) failed: {errors[-1] if errors else '?'}"
        )
    fs, path = open_fs(payload["output"], storage_options)
    with fs.open(path, "rb") as f:
        column = pq.read_table(f, columns=["embedding"]).column("embedding").combine_chunks()
    fs.rm_file(path)
    column = column.drop_null()
    if pa.types.is_list(column.type):  # a multi-vector job's rows: every token's vector counts
        column = column.flatten()
    vectors = column.flatten().to_numpy(zero_copy_only=False).reshape(-1, column.type.list_size)
    if not len(vectors):
        first, last = payload["row_range"]
        raise PlanError(
            f"{fmt.precision} needs calibration ranges from a sample, and the sample ({payload['input']} rows "
            f"{first}-{last}, the job's first item) has no text to embed; use float32, float16, binary or ubinary"
        )
    ranges = ranges_of(vectors, fmt.dim)
    record = {"key": key, "precision": fmt.precision, "dim": fmt.dim, "sample_rows": len(vectors), "ranges": ranges}
    atomic_write(f"{output_url}/{CALIBRATION_NAME}", json.dumps(record).encode(), storage_options)
    return ranges


def with_ranges(items: list[PlannedItem], ranges: list[list[float]]) -> None:
    """Give every item's vector format the job's ranges (not part of `params`: the ranges follow from them)."""
    for item in items:
        item["payload"]["vectors"] = {**item["payload"]["vectors"], "ranges": ranges}
