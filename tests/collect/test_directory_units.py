"""A directory source's tree cut into walk units (collect/directory.py): the units, walked one
after another, give exactly the walk of the whole tree, for trees of every shape."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from megacpp_pipeline.collect import directory
from megacpp_pipeline.collect.directory import WalkUnit, walk_units
from megacpp_pipeline.core.catalog import SourceSpec
from megacpp_pipeline.core.ledger import DropReason


def _files(root: Path, names: list[str]) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"// {name}\n")


def _wide(root: Path) -> None:
    """More top-level entries than units wanted, files and folders interleaved."""
    _files(root, [f"f{i:03d}.h" for i in range(90)] + [f"d{i:02d}/x.h" for i in range(40)])
    _files(root, ["a.h", "a/b.h", "a.hpp", "a0/c.h"])  # `a.h` < `a.hpp` < `a/` < `a0/`


def _deep(root: Path) -> None:
    """One folder down a long chain, the files at the bottom and along the way."""
    _files(root, ["only/one/two/three/four/leaf.h", "only/one/side.h", "only/top.h"])
    _files(root, [f"only/one/two/many{i}.h" for i in range(20)])


def _awkward(root: Path) -> None:
    """Empty folders, a link, a fifo, a name that is not UTF-8, files beside folders."""
    _files(root, ["z.h", "lib/a.h", "lib/sub/b.h", "lib/sub/c.h", "src/main.cc", "m.h"])
    (root / "empty").mkdir()
    (root / "lib" / "empty").mkdir()
    (root / "lib" / "link.h").symlink_to("a.h")
    os.mkfifo(root / "src" / "pipe.cc")
    (root / "src" / os.fsdecode(b"bad\xff.h")).write_text("int bad;\n")


def _unlistable(root: Path) -> None:
    """Files around a chain of folders whose path grows past PATH_MAX: the walk cannot list
    the folders at the bottom (see tests/collect/test_collect.py)."""
    _files(root, ["a.h", "deep/b.h", "z/c.h"])
    fd = os.open(root / "deep", os.O_RDONLY)
    for _ in range(20):
        os.mkdir("d" * 250, dir_fd=fd)
        below = os.open("d" * 250, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = below
    os.close(fd)


@pytest.mark.parametrize("shape", [_wide, _deep, _awkward, _unlistable])
@pytest.mark.parametrize(("want", "depth"), [(1, 3), (2, 3), (3, 1), (7, 2), (64, 3), (500, 5)])
def test_the_units_walked_in_order_are_the_walk_of_the_whole_tree(
    tmp_path: Path, shape: object, want: int, depth: int
) -> None:
    assert callable(shape)
    shape(tmp_path)
    whole = [rel for rel, _ in directory._walk(tmp_path)]
    units = walk_units(tmp_path, want, depth)
    assert units
    assert [rel for u in units for rel, _ in directory._walk(tmp_path, u)] == whole
    assert units == walk_units(tmp_path, want, depth)  # the tree alone decides them
    if want > 1 and shape is _wide:
        assert len(units) >= min(want, 10)  # a wide tree is cut as asked


def test_a_wide_tree_is_cut_into_runs_of_its_listing_no_more_units_than_wanted(
    tmp_path: Path,
) -> None:
    _wide(tmp_path)
    units = walk_units(tmp_path, 8, 3)
    assert len(units) == 8
    assert all(u.dir == "" and u.last is not None for u in units)


def test_an_empty_tree_has_no_units_to_walk(tmp_path: Path) -> None:
    assert walk_units(tmp_path, 64, 3) == []
    assert walk_units(tmp_path, 1, 3) == [WalkUnit()]  # one unit: the walk of nothing


def _flat_and_awkward(root: Path) -> None:
    """One folder of files, a link, a fifo, a file not UTF-8 by name, a subfolder, a file over
    the size limit: more entries than units wanted, so its units carry their runs' names."""
    _files(root, [f"f{i:02d}.h" for i in range(30)] + ["sub/x.h", "sub/y.h"])
    (root / "big.h").write_text("x" * 5000)
    (root / "link.h").symlink_to("f00.h")
    os.mkfifo(root / "pipe.h")
    (root / os.fsdecode(b"bad\xff.h")).write_text("int bad;\n")


@pytest.mark.parametrize("want", [2, 5, 30])
def test_named_units_walk_a_folder_exactly_as_its_listing(tmp_path: Path, want: int) -> None:
    """Every decision the walk makes (drops, sizes, the links and special files it refuses)
    is the same through a unit's names as through the folder's listing."""
    _flat_and_awkward(tmp_path)
    scope = directory.Scope(SourceSpec(id="s", kind="dir", uri=str(tmp_path)), None)
    whole = list(directory._walked(tmp_path, scope, 1000))
    units = walk_units(tmp_path, want, 3)
    assert any(u.names for u in units)
    assert [item for u in units for item in directory._walked(tmp_path, scope, 1000, u)] == whole
    kinds = {type(item).__name__ for item in whole}
    assert kinds == {"Entry", "ToRead"}  # drops and reads both went through the names


def test_a_unit_of_a_large_folder_does_not_list_the_folder_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder cut into runs is listed once, when the units are planned: each unit's walk
    looks up its own entries (it lists only the subfolders it holds)."""
    _files(tmp_path, [f"f{i:03d}.h" for i in range(200)] + ["sub/x.h"])
    units = walk_units(tmp_path, 64, 3)
    assert len(units) == 51  # runs of 4 of the 201 entries
    listed: list[str] = []
    real = os.scandir

    def counting(path: object) -> object:
        listed.append(os.fspath(path))  # type: ignore[arg-type]
        return real(path)  # type: ignore[call-overload]

    monkeypatch.setattr(directory.os, "scandir", counting)
    walked = [rel for u in units for rel, _ in directory._walk(tmp_path, u)]
    assert len(walked) == 201
    assert listed == [str(tmp_path / "sub")]


def test_a_named_entry_gone_before_its_unit_is_walked_is_left_out(tmp_path: Path) -> None:
    _files(tmp_path, [f"f{i}.h" for i in range(10)])
    units = walk_units(tmp_path, 3, 3)
    (tmp_path / "f3.h").unlink()
    walked = [rel for u in units for rel, _ in directory._walk(tmp_path, u)]
    assert walked == [f"f{i}.h" for i in range(10) if i != 3]


def test_a_file_swapped_for_a_link_or_a_fifo_after_the_walk_is_not_read(tmp_path: Path) -> None:
    """Between the walk and the read a file may become a link out of the tree (never
    followed: its target's bytes must not be collected) or a fifo (opening it must not
    hang the run)."""
    secret = tmp_path / "outside.txt"
    secret.write_text("root:x:0:0\n")
    root = tmp_path / "tree"
    _files(root, ["a.h", "b.h", "c.h"])
    scope = directory.Scope(SourceSpec(id="s", kind="dir", uri=str(root)), None)
    walked = {item.path: item for item in directory._walked(root, scope, 1 << 20)}
    (root / "a.h").unlink()
    (root / "a.h").symlink_to(secret)
    (root / "b.h").unlink()
    os.mkfifo(root / "b.h")
    limit = 1 << 20
    link = directory.read_entry(walked["a.h"], limit)
    fifo = directory.read_entry(walked["b.h"], limit)
    assert (link.content, link.reason) == (None, DropReason.SYMLINK)
    assert (fifo.content, fifo.reason) == (None, DropReason.UNSAFE_PATH)
    assert directory.read_entry(walked["c.h"], limit).content == b"// c.h\n"
