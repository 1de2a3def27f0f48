"""Writing an item's rows as a Lance fragment: the worker half of the Lance sink.

A Lance dataset becomes visible one version at a time, by a commit that
lists its fragments. Workers therefore only write fragments (data files
under the dataset's ``data/``, invisible to readers until committed) and
leave the commit to the client, once every part is done (see
pipeline/jobs/lance_output). What a worker does keep, as it keeps Parquet
parts, is a small record per item: a Parquet *marker* at the part's usual
name, holding the fragment's metadata and the item's stamp in its footer, and
one null row per output row. So resume, reindex and the manifest work on
markers exactly as on Parquet parts, and the commit reads the fragments back
from them. A retried item writes a new fragment and replaces the marker; the
earlier attempt's data file is never committed.
"""

from __future__ import annotations

import base64
import json

import pyarrow as pa

from ...scheduler_plugins.protocol import StorageOptions

FRAGMENT_KEY = b"lance.fragment"
SCHEMA_KEY = b"lance.schema"


def lance_storage_options(storage_options: StorageOptions | None) -> dict[str, str] | None:
    """s3fs-style options (key, secret, client_kwargs.endpoint_url) in the names Lance's object store reads."""
    if not storage_options:
        return None
    options: dict[str, str] = {}
    names = {"key": "aws_access_key_id", "secret": "aws_secret_access_key", "token": "aws_session_token"}
    for ours, theirs in names.items():
        if storage_options.get(ours):
            options[theirs] = str(storage_options[ours])
    client = storage_options.get("client_kwargs") or {}
    if client.get("endpoint_url"):
        options["aws_endpoint"] = client["endpoint_url"]
        options["allow_http"] = str(client["endpoint_url"].startswith("http://")).lower()
    if client.get("region_name"):
        options["aws_region"] = client["region_name"]
    return options or None


def write_fragment(dataset_uri: str, table: pa.Table, storage_options: StorageOptions | None) -> pa.Table:
    """Write `table` as an uncommitted fragment of `dataset_uri`; returns the marker table to store as the part."""
    from lance.fragment import LanceFragment

    marker = pa.table({"row": pa.nulls(table.num_rows)})
    stamp = table.schema.metadata or {}  # the item's stamp
    if not table.num_rows:  # nothing to commit: the marker alone says the item is done
        return marker.replace_schema_metadata(stamp)
    data = table.replace_schema_metadata(None)
    fragment = LanceFragment.create(dataset_uri, data, storage_options=lance_storage_options(storage_options))
    return marker.replace_schema_metadata(
        {
            **stamp,
            FRAGMENT_KEY: json.dumps(fragment.to_json()).encode(),
            SCHEMA_KEY: base64.b64encode(data.schema.serialize().to_pybytes()),
        }
    )
