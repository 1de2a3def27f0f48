"""An item's data: reading its rows, shaping them, writing its part, on any fsspec store.

`storage` opens stores and writes files whole (atomic renames, single
PUTs); `input_formats` and `parquet_slices` read an item's rows (JSON
Lines, CSV, Parquet) and build its part and ack; `chunking` cuts long texts
into token windows; `vector_precision` stores vectors compact;
`lance_fragments` writes a part as an uncommitted Lance fragment. The
client side imports these modules too (planning, manifests, reindex): none
of them imports torch or the worker plugin.
"""
