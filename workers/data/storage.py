"""Object-store access shared by workers (parts) and the client (manifests).

A file is written whole or not at all: on local disks under a temporary name,
fsynced, then renamed; on object stores in one PUT. No reader ever sees a
partial file under its final name, and a retried write replaces it whole.
"""

from __future__ import annotations

import errno
import os
import uuid

import fsspec

from ...scheduler_plugins.protocol import StorageOptions

# A store that answers these to one write answers them to the next: read-only, no permission,
# a file where a folder should be, no space left.
REFUSING_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.ENOSPC, errno.EEXIST})


class OutputRefused(OSError):
    """The store refuses the write for good: retrying the item would recompute the same rows for nothing."""


def open_fs(url: str, storage_options: StorageOptions | None = None):
    """(filesystem, path) for a URL or local path."""
    return fsspec.core.url_to_fs(url, **(storage_options or {}))


def is_local(fs) -> bool:
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return "file" in protocols or "local" in protocols


def atomic_write(url: str, data: bytes, storage_options: StorageOptions | None = None) -> None:
    try:
        _atomic_write(url, data, storage_options)
    except OSError as exc:
        if isinstance(exc, PermissionError) or exc.errno in REFUSING_ERRNOS:
            raise OutputRefused(exc.errno, f"{url}: cannot write: {exc.strerror or exc}") from exc
        raise


def _atomic_write(url: str, data: bytes, storage_options: StorageOptions | None) -> None:
    fs, path = open_fs(url, storage_options)
    if not is_local(fs):
        fs.pipe_file(path, data)
        return
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    temporary = os.path.join(parent, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    try:
        with open(temporary, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
