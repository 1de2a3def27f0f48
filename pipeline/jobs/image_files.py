"""Image files as a job's input: one row per file, in items whose membership survives a changing folder.

INPUT is a folder (its image files, by extension, at any depth; hidden and
``_``-prefixed names skipped as for shards) or a glob (``s3://b/images/**/*.jpg``:
every file it matches). A row's id is the file's path under the *root*: the
folder, or a glob's folder before its first wildcard. One listing gives every
file's size and version (etag, mtime...), read from the store as a shard's are.

The files, sorted by path, are cut into groups of about `files_per_item`: a
group ends after a file whose path hashes to 0 modulo `files_per_item` (or at
four times that many files). So where a group ends depends on its own files'
names only: a file added, removed or changed changes its own group, and the
other groups, their parts and their stamps stay as they were; a reindex redoes
one item, not every item after it. Each group is a `Shard` (its first file's
URL names it; its size is its files' sum, its version a digest of their paths,
sizes and versions), so resume, reindex and the manifest's inputs treat it as
they treat a shard, and its one item's part is named from it.
"""

from __future__ import annotations

import hashlib
import posixpath

from ...scheduler_plugins.protocol import ImagePayload, StorageOptions
from ...workers.data.images import IMAGE_EXTENSIONS, is_image_name
from ...workers.data.input_formats import format_of
from ...workers.data.storage import open_fs
from .planner import (
    GLOB_CHARS,
    Plan,
    PlanError,
    PlannedItem,
    Shard,
    check_apart,
    object_version,
    part_name,
)

FORMAT = "images"  # a job's input_format, and each group's Shard.format
# Images per work item at most (on average, for files): an image costs a forward of the order of a hundred texts', so
# the profile's rows_per_item (texts) would make items of minutes; a smaller profile value is kept (tests).
IMAGES_PER_ITEM = 128
ID_COLUMN = "id"  # the rows' paths under the root, unless the job names the column
LONGEST_GROUP = 4  # times the files per item: a group ends there whatever its names hash to


def images_per_item(rows_per_item: int) -> int:
    """An image job's rows per item, from the profile's."""
    return max(1, min(rows_per_item, IMAGES_PER_ITEM))


def holds_images(input_url: str, storage_options: StorageOptions | None = None) -> bool:
    """Whether INPUT means image files: a glob or file named with an image extension, or a folder that holds
    image files and no Parquet, JSON Lines or CSV ones."""
    fs, path = open_fs(input_url, storage_options)
    if any(ch in path for ch in GLOB_CHARS) or not fs.isdir(path):
        return is_image_name(path)
    names = fs.find(path)
    return any(map(is_image_name, names)) and not any(format_of(name) for name in names)


def list_image_groups(
    input_url: str,
    storage_options: StorageOptions | None = None,
    output_url: str | None = None,
    files_per_item: int = IMAGES_PER_ITEM,
) -> list[Shard]:
    """INPUT's image files in groups, each a `Shard` whose `files` are its paths under `root`."""
    try:
        root, listed = _list(input_url, storage_options)
    except PlanError:
        raise
    except Exception as exc:  # credentials, endpoint, permissions: say which input
        raise PlanError(f"cannot list input {input_url!r}: {type(exc).__name__}: {exc}") from exc
    if not listed:
        raise PlanError(f"input {input_url!r} matches no image files ({', '.join(IMAGE_EXTENSIONS)})")
    if output_url:
        check_apart(input_url, output_url, storage_options)
    fs, _ = open_fs(input_url, storage_options)
    groups: list[Shard] = []
    current: list[tuple[str, dict]] = []
    for rel, info in sorted(listed.items()):
        current.append((rel, info))
        if _ends_group(rel, files_per_item) or len(current) >= LONGEST_GROUP * files_per_item:
            groups.append(_group(fs, root, current))
            current = []
    if current:
        groups.append(_group(fs, root, current))
    return groups


def _list(input_url: str, storage_options: StorageOptions | None) -> tuple[str, dict[str, dict]]:
    """(the root's URL, {path under the root: the listing's info}) of every image file INPUT names."""
    fs, path = open_fs(input_url, storage_options)
    fs.invalidate_cache()  # a scheduled run must see today's files
    wildcards = [i for i in map(path.find, GLOB_CHARS) if i >= 0]
    if wildcards:
        root = path[: min(wildcards)].rpartition("/")[0]
        found = fs.glob(path, detail=True)
        wanted = lambda rel: True  # noqa: E731 - the glob chose them
    elif fs.isdir(path):
        root = path.rstrip("/")
        found = fs.find(path, detail=True)
        wanted = is_image_name
    elif fs.exists(path):
        root = posixpath.dirname(path)
        found = {path: fs.info(path)}
        wanted = lambda rel: True  # noqa: E731 - named on its own
    else:
        raise PlanError(f"input {input_url!r} does not exist")
    listed = {}
    for name, info in found.items():
        rel = posixpath.relpath(name, root) if root else name
        hidden = any(part.startswith((".", "_")) for part in rel.split("/"))
        if info.get("type", "file") == "file" and not hidden and wanted(rel):
            listed[rel] = info
    return fs.unstrip_protocol(root) if root else fs.unstrip_protocol(""), listed


def _ends_group(rel: str, files_per_item: int) -> bool:
    return int.from_bytes(hashlib.sha1(rel.encode()).digest()[:8], "big") % max(files_per_item, 1) == 0


def _group(fs, root: str, members: list[tuple[str, dict]]) -> Shard:
    digest = hashlib.sha256()
    for rel, info in members:
        file_version = object_version(info) or f"size:{info.get('size')}"
        digest.update(f"{rel}\0{info.get('size')}\0{file_version}\n".encode())
    first = fs.unstrip_protocol(members[0][1]["name"])
    return Shard(
        url=first,
        size=sum(int(info.get("size") or 0) for _, info in members),
        version=f"files:{digest.hexdigest()}",
        row_groups=[len(members)],
        columns=["image"],
        format=FORMAT,
        root=root,
        files=[rel for rel, _ in members],
    )


def plan_image_job(
    input_url: str,
    output_url: str,
    storage_options: StorageOptions,
    rows_per_item: int,
    model: str,
    op: str,
    payload: ImagePayload,
    apart_from: str | None = None,
) -> Plan:
    """The plan of a job over image files: its groups and their items (`apart_from`: the outputs' root)."""
    shards = list_image_groups(input_url, storage_options, apart_from or output_url, images_per_item(rows_per_item))
    return Plan(shards, plan_image_items(shards, output_url, model, op, payload))


def plan_image_items(
    shards: list[Shard], output_url: str, model: str, op: str, payload: ImagePayload
) -> list[PlannedItem]:
    """One item per group: its files (under its root) in, one part out."""
    output_url = output_url.rstrip("/")
    items: list[PlannedItem] = []
    for index, shard in enumerate(shards):
        rows = len(shard.files)
        name = part_name(shard.url, 0, rows)
        item_payload: ImagePayload = {
            **payload,
            "input": shard.url,
            "format": FORMAT,
            "root": shard.root,
            "files": shard.files,
            "id_column": payload.get("id_column") or ID_COLUMN,
            "row_groups": None,
            "rows": None,
            "row_range": [0, rows],
            "part": name,
            "output": f"{output_url}/{name}",
        }
        items.append({"key": f"{index:06d}-0-{rows}", "model": model, "op": op, "rows": rows, "payload": item_payload})
    return items
