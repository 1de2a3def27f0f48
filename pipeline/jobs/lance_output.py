"""The Lance sink, client half: OUTPUT as a Lance dataset, committed as one version per run.

Workers write fragments and leave a marker part per item under the
dataset's ``_shoal/`` folder (see workers/lance_fragments); everything the
batch machinery knows (resume, stale parts, the manifest, reindex versions)
works on those markers. When every part is done the client commits the
fragments of all current markers as one dataset version (``Overwrite``, so
the version holds each part's rows exactly once, whatever earlier runs or
retried items left behind). A run that fails or is killed commits nothing:
readers keep the previous version. A run that changes nothing commits
nothing either; a reindex that redoes shards is a new version.
"""

from __future__ import annotations

import base64
import importlib.util
import os
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from ...configs import ConfigError
from ...scheduler_plugins.protocol import StorageOptions
from ...workers.data.lance_fragments import FRAGMENT_KEY, SCHEMA_KEY, lance_storage_options
from ...workers.data.storage import open_fs

SCHEME = "lance://"
STAGING = "_shoal"


@dataclass(frozen=True)
class LanceTarget:
    dataset: str  # the dataset's URI, as Lance and lancedb open it
    staging: str  # where markers and the manifest go: <dataset>/_shoal

    @classmethod
    def of(cls, output: str, output_format: str = "parquet") -> LanceTarget | None:
        """The target when OUTPUT is ``lance://PATH`` or `--format lance`; None for Parquet."""
        if not output.startswith(SCHEME) and output_format != "lance":
            return None
        return cls.at(output)

    @classmethod
    def at(cls, output: str) -> LanceTarget:
        """The target for a Lance OUTPUT, ``lance://PATH`` or a plain path."""
        output = output.removeprefix(SCHEME)
        if importlib.util.find_spec("lance") is None:
            raise ConfigError("a Lance OUTPUT needs pylance on the client and the workers: pip install 'shoal[lance]'")
        dataset = output.rstrip("/") if "://" in output else os.path.abspath(os.path.expanduser(output))
        return cls(dataset, f"{dataset}/{STAGING}")


def commit_parts(
    dataset: str, staging: str, part_names: list[str], storage_options: StorageOptions | None
) -> int | None:
    """Commit the fragments the marker parts name as the dataset's next version; returns the version.

    Nothing is committed (the current version is returned) when the dataset
    already holds exactly these fragments, or None when there are no rows.
    """
    import lance
    from lance.fragment import FragmentMetadata

    fs, root = open_fs(staging, storage_options)
    fragments, schema = [], None
    for name in part_names:
        with fs.open(f"{root}/{name}", "rb") as f:
            metadata = pq.read_metadata(f).metadata or {}
        if FRAGMENT_KEY not in metadata:  # an item with no rows wrote no fragment
            continue
        fragments.append(FragmentMetadata.from_json(metadata[FRAGMENT_KEY].decode()))
        schema = schema or pa.ipc.read_schema(pa.py_buffer(base64.b64decode(metadata[SCHEMA_KEY])))
    if schema is None:
        return None
    options = lance_storage_options(storage_options)
    try:
        current = lance.dataset(dataset, storage_options=options)
    except (ValueError, OSError):  # no dataset yet
        current = None
    if current is not None and _files(f.metadata for f in current.get_fragments()) == _files(fragments):
        return current.version
    committed = lance.LanceDataset.commit(
        dataset,
        lance.LanceOperation.Overwrite(schema, fragments),
        read_version=current.version if current is not None else None,
        storage_options=options,
    )
    return committed.version


def _files(fragments) -> set[str]:
    return {file["path"] for fragment in fragments for file in fragment.to_json()["files"]}
