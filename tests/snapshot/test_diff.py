"""The diff's file changes from two ledgers, merged a row group at a time source by source,
agree with one join of the whole ledgers: added, removed and changed paths, a source only in
one snapshot, a ledger without hashes, and a ledger not in path order (joined whole)."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from megacpp_pipeline.snapshot import diff
from megacpp_pipeline.snapshot.streams import OutOfOrderError

SCHEMA = pa.schema([("source_id", pa.string()), ("path", pa.string()), ("sha256", pa.string())])


def ledger(root: Path, rows: list[tuple[str, str, str | None]], group: int = 3) -> Path:
    root.mkdir(parents=True)
    table = pa.Table.from_pylist(
        [{"source_id": s, "path": p, "sha256": h} for s, p, h in rows], schema=SCHEMA
    )
    pq.write_table(table, root / "ledger.parquet", row_group_size=group)
    return root


def files(source: str, n: int, salt: str = "") -> list[tuple[str, str, str | None]]:
    return [(source, f"src/f{i:03d}.cc", f"{source}{i}{salt}") for i in range(n)]


def test_added_removed_and_changed_paths_per_source(tmp_path: Path) -> None:
    old_rows = files("fmt", 10) + files("zlib", 5) + files("gone", 2)
    new_rows = [r for r in files("fmt", 12) if r[1] != "src/f004.cc"]  # f004 removed
    new_rows = [(s, p, h + "x" if p == "src/f007.cc" else h) for s, p, h in new_rows]
    new_rows += files("zlib", 5) + files("fresh", 1)
    old = ledger(tmp_path / "old", old_rows)
    new = ledger(tmp_path / "new", new_rows)
    expected = {
        "fmt": {
            "added": ["src/f010.cc", "src/f011.cc"],
            "removed": ["src/f004.cc"],
            "changed": ["src/f007.cc"],
        },
        "zlib": {},
        "gone": {"removed": ["src/f000.cc", "src/f001.cc"]},
        "fresh": {"added": ["src/f000.cc"]},
    }
    assert diff._file_changes(old, new) == expected
    assert diff._merged_changes(old, new) == expected
    assert diff._joined_changes(old, new) == expected


@pytest.mark.parametrize("seed", range(5))
def test_the_merge_agrees_with_the_whole_join_on_random_ledgers(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    universe = [(s, f"d{rng.randrange(40):02d}/{i}.h") for s in ("a", "b", "c") for i in range(30)]

    def draw(order: str) -> list[tuple[str, str, str | None]]:  # sources in `order`
        rows = [(s, p, rng.choice(["h1", "h2", None])) for s, p in universe if rng.random() < 0.7]
        return sorted(set(rows), key=lambda r: (order.index(r[0]), r[1]))

    old = ledger(tmp_path / "old", draw("cab"), group=rng.randrange(1, 9))
    new = ledger(tmp_path / "new", draw("abc"), group=rng.randrange(1, 9))
    assert diff._merged_changes(old, new) == diff._joined_changes(old, new)


def test_a_file_whose_hash_a_ledger_lacks_is_not_comparable_rather_than_changed(
    tmp_path: Path,
) -> None:
    """A ledger written before ledgers had sha256s said every file changed against a new
    one (and nothing changed against another old one): neither is known."""
    hashed = [("a", "x.h", "1"), ("a", "y.h", "2")]
    bare = [("a", "x.h", None), ("a", "y.h", None), ("a", "z.h", None)]
    old, new = ledger(tmp_path / "old", bare), ledger(tmp_path / "new", hashed)
    expected = {"a": {"removed": ["z.h"], "unknown": ["x.h", "y.h"]}}
    assert diff._merged_changes(old, new) == diff._joined_changes(old, new) == expected
    both_bare = ledger(tmp_path / "bare", bare)
    assert diff._file_changes(old, both_bare) == {"a": {"unknown": ["x.h", "y.h", "z.h"]}}
    one_copy_bare = ledger(tmp_path / "dup", [("a", "x.h", "1"), ("a", "x.h", None)])
    assert diff._file_changes(new, one_copy_bare) == {"a": {"removed": ["y.h"], "unknown": ["x.h"]}}


def test_a_ledger_out_of_path_order_is_joined_whole(tmp_path: Path) -> None:
    old = ledger(tmp_path / "old", [("a", "z.h", "1"), ("a", "b.h", "1")])
    new = ledger(tmp_path / "new", [("a", "b.h", "2"), ("a", "c.h", "1")])
    with pytest.raises(OutOfOrderError, match="not in path order"):
        diff._merged_changes(old, new)
    assert diff._file_changes(old, new) == {
        "a": {"added": ["c.h"], "removed": ["z.h"], "changed": ["b.h"]}
    }


@pytest.mark.parametrize("group", [1, 2, 3, 4])
def test_a_path_ledgered_twice_gives_one_answer_wherever_row_groups_end(
    tmp_path: Path, group: int
) -> None:
    """Every copy of an ambiguous name is ledgered, so a source can name a path twice; the
    merge said `changed` twice, or `added` and `changed`, depending on where a row group
    ended between those rows."""
    old_rows = [("a", "a.h", "1"), ("a", "dup.h", "7"), ("a", "z.h", "1")]
    new_rows = [("a", "a.h", "1"), ("a", "dup.h", "7"), ("a", "dup.h", "8"), ("a", "z.h", "1")]
    old = ledger(tmp_path / "old", old_rows, group=group)
    new = ledger(tmp_path / "new", new_rows, group=group)
    expected = {"a": {"changed": ["dup.h"]}}
    assert diff._merged_changes(old, new) == expected
    assert diff._joined_changes(old, new) == expected
    same = ledger(tmp_path / "same", new_rows, group=5 - group)
    assert diff._merged_changes(new, same) == {"a": {}}
    assert diff._merged_changes(new, old) == expected


@pytest.mark.parametrize("seed", range(5))
def test_the_merge_agrees_with_the_join_when_paths_repeat(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    paths = [f"{k:02d}.h" for k in range(12)]

    def draw() -> list[tuple[str, str, str | None]]:
        rows = [
            ("a", p, rng.choice(["h1", "h2"]))
            for p in paths
            for _ in range(rng.choice([0, 1, 1, 2, 3]))
        ]
        return sorted(rows, key=lambda r: r[1])

    old = ledger(tmp_path / "old", draw(), group=rng.randrange(1, 5))
    new = ledger(tmp_path / "new", draw(), group=rng.randrange(1, 5))
    assert diff._merged_changes(old, new) == diff._joined_changes(old, new)


def test_the_markdown_counts_files_not_comparable_and_says_why() -> None:
    change = diff.SourceChange("a", "r1", "r1", changed=["b.h"], unknown=["x.h", "y.h"])
    d = diff.SnapshotDiff("old", "new", [change], (3, 3), {}, {}, {}, tokenizer_changed=False)
    text = diff.render_markdown(d)
    assert "| source | files added | removed | changed | not comparable | documents |" in text
    assert "| a | 0 | 0 | 1 | 2 | 0 -> 0 (+0) |" in text
    assert "- a not comparable: `x.h`, `y.h`" in text and "records no sha256" in text
    assert not d.empty
    plain = diff.render_markdown(diff.SnapshotDiff("o", "n", [], (0, 0), {}, {}, {}, False))
    assert "not comparable" not in plain
