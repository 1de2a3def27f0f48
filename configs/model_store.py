"""A model folder in object storage (any fsspec URL: ``s3://bucket/models/bge-small/``), copied to a local cache.

The usual store of a Kubernetes cluster whose pods share no disk. Each machine copies the folder once into
``$SHOAL_CACHE_DIR/models/``, in a folder named by the URL and the listing's key: a hash of every file's
name, size and ETag (or checksum, else modification time) as the store lists them. The key pins the
contents: the client resolves the folder, fingerprints its copy and sends the key in the spec's source
(``URL@KEY``), so a worker that finds the folder changed since refuses it rather than computing with other
weights than the job's.

A copy is made in a staging folder beside its place and renamed into it once every file is in, its record
written beside it last (the copy holds the model's files only, so its fingerprint is theirs), and a copy is
used only with its record: a half-copied folder is never loaded. Workers of one machine copy it once,
under a file lock. Each file's
sha256 is recorded as it is copied (and its MD5 checked against a plain ETag, an S3 single-part upload's)
and checked again whenever the folder is used (once per process and file modification), so a cached file
corrupted since is found, and the folder fetched again. A folder without weights is refused before any
work, naming the URL. Nothing here imports torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from . import ConfigError, cache_dir

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
RECORD = ".json"  # beside a cached copy (FOLDER.json): the URL, the key, every file's size, tag and sha256
TAG_FIELDS = ("ETag", "etag", "md5Hash", "crc32c", "checksum", "sha256")  # what a listing names content by
TIME_FIELDS = ("LastModified", "mtime", "updated", "last_modified", "created")  # else, when it was written
MD5_ETAG = re.compile(r'^"?([0-9a-f]{32})"?$')  # an S3 ETag of a single-part upload is the object's MD5
CHUNK = 1 << 20


def is_store_url(name: str) -> bool:
    """A model named by an fsspec URL (``s3://…``, ``gs://…``, ``file://…``), not a folder or a Hub id."""
    return "://" in name


@dataclass(frozen=True)
class Listed:
    """One file of the folder as the store lists it."""

    name: str  # relative to the folder, with "/"
    size: int
    tag: str  # its ETag or checksum, else its modification time


@dataclass(frozen=True)
class StoreCopy:
    """A verified local copy of a store folder, and whether this call fetched it."""

    url: str
    key: str
    folder: Path
    fetched: bool

    @property
    def source(self) -> str:
        """What a spec's source says: the URL pinned to this listing."""
        return pinned(self.url, self.key)


def pinned(url: str, key: str) -> str:
    return f"{url.rstrip('/')}/@{key[:16]}"


def unpinned(source: str) -> tuple[str, str | None]:
    """(URL, key prefix or None) of a store source."""
    url, sep, key = source.rpartition("/@")
    return (url + "/", key) if sep else (source, None)


def listing(url: str, storage_options: dict[str, Any]) -> list[Listed]:
    """Every file under `url`, as the store lists it; a ConfigError naming the URL if it cannot be listed."""
    import fsspec

    try:
        fs, root = fsspec.core.url_to_fs(url.rstrip("/"), **storage_options)
        found = fs.find(root, detail=True)
    except (OSError, ValueError, ImportError) as exc:
        raise ConfigError(f"model folder {url}: cannot list it ({type(exc).__name__}: {exc})") from None
    entries = []
    for path, info in sorted(found.items()):
        if info.get("type", "file") != "file":
            continue
        name = path[len(root.rstrip("/")) + 1 :] if path.startswith(root.rstrip("/") + "/") else path
        tag = next((str(info[f]) for f in TAG_FIELDS if info.get(f)), "")
        tag = tag or next((f"time {info[f]}" for f in TIME_FIELDS if info.get(f)), "")
        entries.append(Listed(name, int(info.get("size") or 0), tag))
    return entries


def listing_key(entries: list[Listed]) -> str:
    digest = hashlib.sha256()
    for entry in entries:
        digest.update(f"{entry.name}\0{entry.size}\0{entry.tag}\n".encode())
    return digest.hexdigest()


def check_weights(url: str, entries: list[Listed]) -> None:
    """A folder without model weights is refused, naming the URL, before anything is fetched."""
    if not entries:
        raise ConfigError(f"model folder {url}: nothing there (no such folder, or it is empty)")
    if not any(entry.name.endswith(WEIGHT_SUFFIXES) for entry in entries):
        names = ", ".join(entry.name for entry in entries[:8]) + (" …" if len(entries) > 8 else "")
        raise ConfigError(
            f"model folder {url}: no model weights in it ({', '.join('*' + s for s in WEIGHT_SUFFIXES)}); "
            f"it holds {names}"
        )


def local_copy(url: str, storage_options: dict[str, Any], pin: str | None = None) -> StoreCopy:
    """This machine's verified copy of the folder at `url` (fetched if it has none, or a damaged one).

    `pin`: the key (a prefix of it) the client resolved: a folder listed otherwise now is refused.
    """
    entries = listing(url, storage_options)
    key = listing_key(entries)
    if pin is not None and not key.startswith(pin):
        raise ConfigError(
            f"model folder {url} changed since it was resolved (its listing is {key[:16]} now, {pin} then): "
            "run the command again to use what it holds now"
        )
    check_weights(url, entries)
    folder = cache_dir() / "models" / f"{_slug(url)}-{key[:16]}"
    if _verified(folder, key, entries):
        return StoreCopy(url, key, folder, fetched=False)
    from filelock import FileLock

    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        if _verified(folder, key, entries):  # another worker of this machine fetched it meanwhile
            return StoreCopy(url, key, folder, fetched=False)
        _fetch(url, storage_options, key, entries, folder)
    return StoreCopy(url, key, folder, fetched=True)


def _slug(url: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", url.split("://", 1)[-1].strip("/"))[-80:]


def _fetch(url: str, storage_options: dict[str, Any], key: str, entries: list[Listed], folder: Path) -> None:
    """Copy every listed file into a staging folder, check it, then rename it into place (under the lock)."""
    import fsspec

    staging = folder.with_name(f".{folder.name}.staging")
    shutil.rmtree(staging, ignore_errors=True)  # a copy a killed process left half done
    fs, root = fsspec.core.url_to_fs(url.rstrip("/"), **storage_options)
    files: dict[str, dict[str, Any]] = {}
    try:
        for entry in entries:
            target = staging / entry.name
            target.parent.mkdir(parents=True, exist_ok=True)
            sha256, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
            with fs.open(f"{root.rstrip('/')}/{entry.name}", "rb") as source, open(target, "wb") as out:
                while chunk := source.read(CHUNK):
                    sha256.update(chunk)
                    md5.update(chunk)
                    out.write(chunk)
            size = target.stat().st_size
            plain = MD5_ETAG.match(entry.tag)
            if size != entry.size or (plain and plain.group(1) != md5.hexdigest()):
                raise ConfigError(
                    f"model folder {url}: {entry.name} arrived damaged ({size} bytes, listed {entry.size}"
                    + (f"; MD5 {md5.hexdigest()}, ETag {plain.group(1)}" if plain else "")
                    + "): fetch it again"
                )
            files[entry.name] = {"size": size, "tag": entry.tag, "sha256": sha256.hexdigest()}
        record = record_path(folder)
        record.unlink(missing_ok=True)  # a damaged copy: without its record it is never used
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    staged = record.with_name(f".{record.name}.{os.getpid()}")
    staged.write_text(json.dumps({"url": url, "key": key, "files": files}, indent=1))
    os.replace(staged, record)


def record_path(folder: Path) -> Path:
    """Where a copy's record is: beside it, so the copy holds the model's own files only."""
    return folder.with_name(folder.name + RECORD)


def _verified(folder: Path, key: str, entries: list[Listed]) -> bool:
    """The copy holds every listed file, each of the listed size and of the sha256 recorded as it was copied."""
    try:
        record = json.loads(record_path(folder).read_text())
    except (OSError, ValueError):
        return False
    files = record.get("files") or {}
    if record.get("key") != key or set(files) != {entry.name for entry in entries}:
        return False
    for entry in entries:
        path = folder / entry.name
        try:
            stat = path.stat()
        except OSError:
            return False
        if (
            stat.st_size != entry.size
            or _sha256(str(path), stat.st_size, stat.st_mtime_ns) != files[entry.name]["sha256"]
        ):
            return False
    return True


@lru_cache(maxsize=256)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    """A file's sha256, once per process for each (size, modification) of it."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
