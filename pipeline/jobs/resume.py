"""Resuming a job: which planned parts the output already holds, current.

A part is current when it came from the same input version (size and
version), the same model fingerprint and the same operation options. Each
part carries that record, its *stamp*, in its Parquet footer (key-value
metadata ``shoal.*``), written in the same atomic write as its rows. So a run
killed at any moment needs no journal: the output itself says what is done,
and a part whose input changed since is simply redone. A manifest, written
last by a finished run, records the same facts for the parts it lists, so a
re-run over a finished output reads no footers for them, only a listing.

Parts in the output that belong to no planned item (a removed shard, another
slicing, a shrunk shard) are *stale*: the runner deletes them, so a reader of
the directory never mixes them in. Only names of Shoal's part pattern are
ever deleted; other files are left alone.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from ...scheduler_plugins.protocol import PartRecord, SlicePayload, StorageOptions
from ...workers.data.storage import open_fs
from .manifest import Manifest
from .planner import Plan, PlannedItem, Shard

STAMP_PREFIX = "shoal."
PART_NAME = re.compile(r"^part-.+-[0-9a-f]{8}-\d{10}-\d{10}\.parquet$")
FOOTER_TAIL = 64 * 1024  # one ranged read holds a part's footer in practice
FOOTER_READERS = 16


def job_params(op: str, options: SlicePayload) -> str:
    """Digest of the operation and the options that change a part's content."""
    text = json.dumps({"op": op, **options}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def part_stamp(shard_url: str, size: int, version: str, fingerprint: str, params: str) -> dict[str, str]:
    """What a part was made from; equal stamps mean equal content."""
    return {
        "shoal.input": shard_url,
        "shoal.input_size": str(size),
        "shoal.input_version": version,
        "shoal.model_fingerprint": fingerprint,
        "shoal.params": params,
    }


def stamp_items(plan: Plan, fingerprint: str, params: str) -> None:
    """Give every item the stamp its worker writes into the part's footer."""
    shards = {shard.url: shard for shard in plan.shards}
    for item in plan.items:
        shard = shards[item["payload"]["input"]]
        item["payload"]["part_metadata"] = part_stamp(shard.url, shard.size, shard.version, fingerprint, params)


def current_parts(
    manifest: Manifest | None, fingerprint: str, params: str, shards: list[Shard]
) -> dict[str, PartRecord]:
    """The manifest's parts that are still current, by name (none if it cannot tell)."""
    if not manifest or manifest.get("params") != params:
        return {}
    model = manifest.get("model")
    if model is None or model.get("fingerprint") != fingerprint:
        return {}
    recorded = {entry["url"]: (entry["size"], entry["version"]) for entry in manifest.get("inputs", [])}
    now = {shard.url: (shard.size, shard.version) for shard in shards}
    return {
        part["name"]: PartRecord(
            part=part["name"], input=part["input"], row_range=part["row_range"], rows=part["rows"], bytes=part["bytes"]
        )
        for part in manifest.get("parts", [])
        if part["input"] in now and recorded.get(part["input"]) == now[part["input"]]
    }


@dataclass
class Inventory:
    """The planned items split by what the output holds."""

    todo: list[PlannedItem] = field(default_factory=list)
    done: dict[str, PartRecord] = field(default_factory=dict)  # part name -> ack-shaped record
    stale: list[str] = field(default_factory=list)


class PartStore:
    """The parts directly under one output location: list, check stamps, remove."""

    def __init__(self, output_url: str, storage_options: StorageOptions | None = None) -> None:
        self.url = output_url.rstrip("/")
        self.fs, path = open_fs(self.url, storage_options)
        self.path = path.rstrip("/")

    def list_parts(self) -> dict[str, int]:
        """Part name -> size, fresh from the store (listings are cached by fsspec)."""
        self.fs.invalidate_cache(self.path)
        try:
            entries = self.fs.ls(self.path, detail=True)
        except FileNotFoundError:
            return {}
        names = {posixpath.basename(e["name"].rstrip("/")): e for e in entries if e.get("type") == "file"}
        return {name: int(e.get("size") or 0) for name, e in names.items() if PART_NAME.match(name)}

    def inventory(self, items: list[PlannedItem], trusted: dict[str, PartRecord] | None = None) -> Inventory:
        """Split `items` into done and to do; `trusted` parts skip the footer check.

        A trusted record (from a manifest, or checked earlier in this run)
        still has to be listed with the size it recorded.
        """
        trusted = trusted or {}
        listed = self.list_parts()
        planned = {item["payload"]["part"]: item for item in items}
        result = Inventory(stale=sorted(set(listed) - set(planned)))
        to_check = []
        for name, item in planned.items():
            if name not in listed:
                continue
            record = trusted.get(name)
            if record is not None and record["bytes"] == listed[name]:
                result.done[name] = record
            else:
                to_check.append(item)
        names = [item["payload"]["part"] for item in to_check]
        with ThreadPoolExecutor(FOOTER_READERS) as pool:
            footers = dict(zip(names, pool.map(lambda name: self._footer(name, listed[name]), names)))
        for item in to_check:
            payload = item["payload"]
            metadata = footers[payload["part"]]
            if metadata is not None and _stamp(metadata) == payload["part_metadata"]:
                result.done[payload["part"]] = {
                    "part": payload["part"],
                    "input": payload["input"],
                    "row_range": payload["row_range"],
                    "rows": metadata.num_rows,
                    "bytes": listed[payload["part"]],
                }
        result.todo = [item for name, item in planned.items() if name not in result.done]
        return result

    def remove(self, names: list[str]) -> int:
        if names:
            self.fs.rm([f"{self.path}/{name}" for name in names])
        return len(names)

    def _footer(self, name: str, size: int) -> pq.FileMetaData | None:
        """The part's footer from one ranged read; None if it is unreadable (then redone)."""
        path = f"{self.path}/{name}"
        try:
            start = max(0, size - FOOTER_TAIL)
            tail = self.fs.cat_file(path, start=start)
            needed = struct.unpack("<I", tail[-8:-4])[0] + 8
            if needed > len(tail) and start > 0:
                tail = self.fs.cat_file(path, start=max(0, size - needed))
            return pq.read_metadata(pa.BufferReader(tail))
        except (OSError, ValueError, struct.error, pa.ArrowException):
            return None


def _stamp(metadata: pq.FileMetaData) -> dict[str, str]:
    return {
        key.decode(): value.decode()
        for key, value in (metadata.metadata or {}).items()
        if key.startswith(STAMP_PREFIX.encode())
    }
