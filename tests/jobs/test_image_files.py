"""Planning a job over image files: one row per file, ids under the root, groups that survive a changing folder."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from shoal.pipeline.jobs.image_files import (
    FORMAT,
    LONGEST_GROUP,
    holds_images,
    list_image_groups,
    plan_image_items,
)
from shoal.pipeline.jobs.planner import PlanError
from shoal.scheduler_plugins.protocol import ImagePayload


def make_folder(root: Path, names: list[str]) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\xff\xd8" + name.encode())  # bytes only: planning never decodes


def rows(groups) -> list[str]:
    return [rel for group in groups for rel in group.files]


def test_a_folder_lists_its_images_at_any_depth_by_path_under_it(tmp_path: Path) -> None:
    names = [f"cats/{i:03d}.jpg" for i in range(40)] + ["dogs/a.PNG", "dogs/deep/b.webp", "top.jpeg"]
    make_folder(tmp_path / "images", [*names, "notes.txt", ".hidden.jpg", "_tmp/x.jpg", "cats/.x.jpg"])
    groups = list_image_groups(str(tmp_path / "images"), files_per_item=8)
    assert rows(groups) == sorted(names)  # every image once, in path order; others, hidden and _ names skipped
    assert all(group.format == FORMAT and group.root == f"file://{tmp_path}/images" for group in groups)
    assert sum(group.rows for group in groups) == len(names)
    assert len(groups) > 1  # cut into items
    assert all(group.url == f"file://{tmp_path}/images/{group.files[0]}" for group in groups)


def test_a_glob_takes_what_it_matches_relative_to_its_folder(tmp_path: Path) -> None:
    make_folder(tmp_path / "b", ["images/x/1.jpg", "images/y/2.jpg", "images/y/3.png", "images/z.jpg"])
    groups = list_image_groups(f"{tmp_path}/b/images/**/*.jpg")
    assert rows(groups) == ["x/1.jpg", "y/2.jpg", "z.jpg"]
    assert groups[0].root == f"file://{tmp_path}/b/images"


def test_groups_change_only_where_the_folder_changed(tmp_path: Path) -> None:
    folder = tmp_path / "images"
    make_folder(folder, [f"{i:05d}.jpg" for i in range(600)])
    before = {group.url: group for group in list_image_groups(str(folder), files_per_item=16)}
    make_folder(folder, ["00123b.jpg"])  # a file added in the middle
    (folder / "00400.jpg").write_bytes(b"changed")  # a file changed
    after = {group.url: group for group in list_image_groups(str(folder), files_per_item=16)}
    changed = [url for url, group in after.items() if url not in before or before[url].version != group.version]
    assert rows(after.values()) == sorted([f"{i:05d}.jpg" for i in range(600)] + ["00123b.jpg"])
    assert 1 <= len(changed) <= 4  # the groups holding the two files (a group may end at the new name)
    assert len(after) > 20


def test_no_group_is_longer_than_its_cap(tmp_path: Path) -> None:
    make_folder(tmp_path / "i", [f"{i:04d}.jpg" for i in range(300)])
    groups = list_image_groups(str(tmp_path / "i"), files_per_item=2_000)  # names alone would make one group
    assert max(group.rows for group in groups) <= LONGEST_GROUP * 2_000
    groups = list_image_groups(str(tmp_path / "i"), files_per_item=10)
    assert max(group.rows for group in groups) <= LONGEST_GROUP * 10


def test_items_name_their_files_and_part(tmp_path: Path) -> None:
    make_folder(tmp_path / "i", [f"{i}.jpg" for i in range(30)])
    groups = list_image_groups(str(tmp_path / "i"), files_per_item=8)
    items = plan_image_items(groups, f"{tmp_path}/out/", "clip", "embed", {"id_column": "id"})
    assert [item["rows"] for item in items] == [group.rows for group in groups]
    first = cast(ImagePayload, items[0]["payload"])
    assert first["files"] == groups[0].files and first["root"] == groups[0].root and first["id_column"] == "id"
    assert first["output"] == f"{tmp_path}/out/{first['part']}"
    assert len({item["payload"]["part"] for item in items}) == len(items)


def test_what_is_not_images_is_refused_or_told_apart(tmp_path: Path) -> None:
    make_folder(tmp_path / "text", ["a.parquet", "b.jpg"])
    make_folder(tmp_path / "pics", ["a.jpg", "sub/b.png"])
    assert holds_images(str(tmp_path / "pics"))
    assert holds_images(f"{tmp_path}/pics/**/*.png")
    assert not holds_images(str(tmp_path / "text"))  # tables win: its image is not a row
    assert not holds_images(f"{tmp_path}/text/*.parquet")
    with pytest.raises(PlanError, match="matches no image files"):
        list_image_groups(f"{tmp_path}/pics/*.gif")
    with pytest.raises(PlanError, match="does not exist"):
        list_image_groups(str(tmp_path / "nowhere"))
    with pytest.raises(PlanError, match="inside input"):
        list_image_groups(str(tmp_path / "pics"), output_url=str(tmp_path / "pics" / "vectors"))
