import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shoal.pipeline.jobs.planner import PlanError, list_shards, part_name, plan_items, read_footers, slices


def test_slices_group_row_groups_and_split_large_ones():
    assert slices([100, 100, 100], 250) == [(0, 2, 0, 200), (2, 3, 200, 300)]
    assert slices([500], 200) == [(0, 1, 0, 200), (0, 1, 200, 400), (0, 1, 400, 500)]
    assert slices([50, 500, 50], 200) == [
        (0, 1, 0, 50),
        (1, 2, 50, 250),
        (1, 2, 250, 450),
        (1, 2, 450, 550),
        (2, 3, 550, 600),
    ]
    assert slices([], 100) == [] and slices([0], 100) == []


def test_listing_file_directory_glob_and_hidden_files(tmp_path):
    for name in ("a.parquet", "b.parquet", "_skip.parquet", ".hidden.parquet", "notes.txt"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.parquet").write_bytes(b"x")
    names = lambda shards: [s.url.rsplit("/", 1)[1] for s in shards]  # noqa: E731
    assert names(list_shards(str(tmp_path))) == ["a.parquet", "b.parquet", "c.parquet"]
    assert names(list_shards(str(tmp_path / "b.parquet"))) == ["b.parquet"]
    assert names(list_shards(str(tmp_path / "*.parquet"))) == ["_skip.parquet", "a.parquet", "b.parquet"]
    assert all(s.version.startswith("mtime:") and s.size == 1 for s in list_shards(str(tmp_path)))
    with pytest.raises(PlanError, match="matches no CSV files"):
        list_shards(str(tmp_path / "*.csv"))


def test_items_carry_row_ranges_and_unreadable_shards_still_get_an_item(tmp_path):
    pq.write_table(pa.table({"text": ["t"] * 300}), tmp_path / "good.parquet", row_group_size=100)
    (tmp_path / "bad.parquet").write_bytes(b"junk")
    shards = list_shards(str(tmp_path))
    read_footers(shards)
    assert shards[0].error and shards[1].row_groups == [100, 100, 100]
    items = plan_items(shards, "out/", 200, "m", "embed", {"text_column": "text"})
    bad, *good = items
    assert bad["payload"]["row_groups"] is None and bad["rows"] == 0
    assert [(i["payload"]["row_groups"], i["payload"]["rows"], i["rows"]) for i in good] == [
        ([0, 2], None, 200),
        ([2, 3], None, 100),
    ]
    assert good[0]["payload"]["output"] == "out/" + part_name(shards[1].url, 0, 200)
    assert len({i["key"] for i in items}) == len(items)
