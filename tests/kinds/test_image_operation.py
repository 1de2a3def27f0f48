"""The image kind's batch operation on real files: read (fetch), compute (the runtime), write (the part).

Its items come from image_files.py's plan (files under a root) or name an image column (bytes, URIs, or a
datasets Image struct); every row gets a vector or a null with a rejection naming its file or row.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shoal.configs import ModelSpec
from shoal.pipeline.jobs.image_files import list_image_groups, plan_image_items
from shoal.scheduler_plugins.protocol import ImagePayload
from shoal.workers.devices import DevicePlan
from tests.support.image_models import CLIP_DIM, TEXT_WINDOW, decompression_bomb, draw_images, encoded, truncated

pytestmark = pytest.mark.integration

PLAN = DevicePlan("cpu", "cpu", "float32", 10**9, 1)


@pytest.fixture(scope="module")
def runtime(clip_folder: Path):
    from shoal.workers.runtimes.image_embedder import ImageEmbedder

    spec = ModelSpec(
        name="clip", kind="image_embedder", source=str(clip_folder), dim=CLIP_DIM, max_seq_length=TEXT_WINDOW,
        normalize=True, image_batch={"cpu": 4},
    )  # fmt: skip
    loaded = ImageEmbedder(spec, PLAN)
    yield loaded
    loaded.close()


def run_item(runtime, payload):
    from shoal.workers.operations import image_operation

    data = image_operation.read(payload)
    return image_operation.write(payload, data, image_operation.compute(runtime, data), runtime.spec)


def test_files_in_a_part_by_path_bad_ones_named(runtime, tmp_path: Path) -> None:
    pictures = draw_images(9, seed=5)
    folder = tmp_path / "images"
    (folder / "sub").mkdir(parents=True)
    names = [f"{i}.jpg" for i in range(7)] + ["sub/7.png", "sub/8.jpg"]
    for name, picture in zip(names, pictures):
        (folder / name).write_bytes(encoded(picture, "PNG" if name.endswith("png") else "JPEG"))
    (folder / "3.jpg").write_bytes(truncated((folder / "3.jpg").read_bytes()))
    (folder / "sub" / "bomb.png").write_bytes(decompression_bomb())
    (folder / "notes.jpg").write_text("these are not pixels")

    (group,) = list_image_groups(str(folder))
    (item,) = plan_image_items([group], str(tmp_path / "out"), "clip", "embed", {"id_column": "id"})
    ack = run_item(runtime, item["payload"])

    part = pq.read_table(item["payload"]["output"])
    ids = part.column("id").to_pylist()
    assert ids == sorted([*names, "sub/bomb.png", "notes.jpg"])
    vectors = part.column("embedding").to_pylist()
    good = {rel: vector for rel, vector in zip(ids, vectors) if vector is not None}
    assert sorted(good) == sorted(set(names) - {"3.jpg"})
    direct, rejected = runtime.embed_images([(folder / rel).read_bytes() for rel in sorted(good)])
    assert rejected == {}
    np.testing.assert_allclose(np.array([good[rel] for rel in sorted(good)]), direct, atol=1e-6)
    assert ack["rows"] == 11 and ack["rejected"] == 3 and ack["null_images"] == 0
    truncated_file, not_image, bomb = sorted(ack["rejections"])
    assert truncated_file.startswith(f"{group.root}/3.jpg: JPEG 48x40 cannot be decoded: image file is truncated")
    assert not_image == f"{group.root}/notes.jpg: not an image: no format Pillow reads starts its 20 bytes"
    assert bomb == (
        f"{group.root}/sub/bomb.png: 10000x10000 = 100,000,000 pixels, over the limit of 89,478,485 "
        "(a decompression bomb?)"
    )


def test_a_column_of_bytes_uris_and_datasets_structs(runtime, tmp_path: Path) -> None:
    pictures = [encoded(p) for p in draw_images(4, seed=6)]
    (tmp_path / "x.jpg").write_bytes(pictures[2])
    shard = tmp_path / "shard.parquet"
    table = pa.table(
        {
            "key": ["a", "b", "c", "d", "e", "f"],
            "bytes": pa.array([pictures[0], None, b"junk", pictures[1], pictures[2], pictures[3]], pa.binary()),
            "uri": [str(tmp_path / "x.jpg"), None, str(tmp_path / "missing.jpg"), "data:,nope", None, None],
            "hf": pa.array(
                [{"bytes": pictures[0], "path": None}, None, {"bytes": None, "path": str(tmp_path / "x.jpg")}] * 2
            ),
        }
    )
    pq.write_table(table, shard)
    expected, _ = runtime.embed_images(pictures)

    def item(column: str) -> dict:
        name = f"part-{column}.parquet"
        return {
            "input": str(shard), "image_column": column, "id_column": "key", "row_groups": None, "rows": None,
            "row_range": [0, 6], "part": name, "output": str(tmp_path / "out" / name),
        }  # fmt: skip

    ack = run_item(runtime, item("bytes"))
    part = pq.read_table(item("bytes")["output"])
    assert part.column("key").to_pylist() == ["a", "b", "c", "d", "e", "f"]
    vectors = part.column("embedding").to_pylist()
    assert vectors[1] is None and vectors[2] is None
    np.testing.assert_allclose(np.array([vectors[i] for i in (0, 3, 4, 5)]), expected, atol=1e-6)
    assert ack["null_images"] == 1 and ack["rejected"] == 1
    assert ack["rejections"] == [
        f"{shard} row 2, column 'bytes': not an image: no format Pillow reads starts its 4 bytes"
    ]

    ack = run_item(runtime, item("uri"))
    vectors = pq.read_table(item("uri")["output"]).column("embedding").to_pylist()
    np.testing.assert_allclose(vectors[0], expected[2], atol=1e-6)
    assert [v is None for v in vectors] == [False, True, True, True, True, True]
    assert ack["null_images"] == 3 and ack["rejected"] == 2
    assert ack["rejections"][0] == f"{shard} row 2, column 'uri': {tmp_path}/missing.jpg: no such file"
    assert ack["rejections"][1].startswith(f"{shard} row 3, column 'uri': data:,nope: not an image")

    run_item(runtime, item("hf"))
    vectors = pq.read_table(item("hf")["output"]).column("embedding").to_pylist()
    np.testing.assert_allclose(np.array([vectors[i] for i in (0, 2, 3, 5)]), expected[[0, 2, 0, 2]], atol=1e-6)


def test_a_text_column_goes_through_the_text_tower(runtime, tmp_path: Path) -> None:
    shard = tmp_path / "texts.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3], "text": ["a red cat", None, "a blue boat"]}), shard)
    payload = {
        "input": str(shard), "text_column": "text", "id_column": "id", "row_groups": None, "rows": None,
        "row_range": [0, 3], "part": "part-t.parquet", "output": str(tmp_path / "out" / "part-t.parquet"),
    }  # fmt: skip
    ack = run_item(runtime, payload)
    vectors = pq.read_table(payload["output"]).column("embedding").to_pylist()
    expected, _ = runtime.embed(["a red cat", "a blue boat"])
    np.testing.assert_allclose(np.array([vectors[0], vectors[2]]), expected, atol=1e-6)
    assert vectors[1] is None and ack["null_texts"] == 1


def test_precision_dim_and_a_lance_fragment_as_for_texts(runtime, tmp_path: Path) -> None:
    import lance

    from shoal.pipeline.jobs.lance_output import commit_parts
    from shoal.workers.data.lance_fragments import FRAGMENT_KEY
    from shoal.workers.data.vector_precision import VectorFormat, compact

    folder = tmp_path / "images"
    folder.mkdir()
    for i, picture in enumerate(draw_images(5, seed=9)):
        (folder / f"{i}.jpg").write_bytes(encoded(picture))
    (group,) = list_image_groups(str(folder))
    payload: ImagePayload = {"id_column": "id", "vectors": {"precision": "float16", "dim": 8}}
    (item,) = plan_image_items([group], str(tmp_path / "out"), "clip", "embed", payload)
    run_item(runtime, item["payload"])
    column = pq.read_table(item["payload"]["output"]).column("embedding")
    assert column.type == pa.list_(pa.float16(), 8)
    full, _ = runtime.embed_images([(folder / f"{i}.jpg").read_bytes() for i in range(5)])
    expected = compact(full, VectorFormat(precision="float16", dim=8))  # shortened, re-normalised, half precision
    np.testing.assert_allclose(np.array(column.to_pylist(), dtype=np.float16), expected, atol=1e-3)

    dataset = str(tmp_path / "vectors.lance")
    (item,) = plan_image_items(
        [group], str(tmp_path / "markers"), "clip", "embed", {"id_column": "id", "lance": dataset}
    )
    ack = run_item(runtime, item["payload"])
    marker = pq.ParquetFile(item["payload"]["output"])
    assert FRAGMENT_KEY in marker.schema_arrow.metadata and ack["rows"] == 5
    commit_parts(dataset, str(tmp_path / "markers"), [item["payload"]["part"]], {})  # what the client does at the end
    table = lance.dataset(dataset).to_table().sort_by("id")
    assert table.column("id").to_pylist() == [f"{i}.jpg" for i in range(5)]
    np.testing.assert_allclose(np.array(table.column("embedding").to_pylist()), full, atol=1e-6)
