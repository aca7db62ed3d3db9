"""Collection at a pinned revision: git commits, verified archives, hashed dirs; hostile
archive members are refused one by one while every good file of the source is kept."""

from __future__ import annotations

import gzip
import hashlib
import io
import lzma
import os
import re
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from megacpp_pipeline import collect
from megacpp_pipeline.core.catalog import CollectLimits, SourceSpec
from megacpp_pipeline.core.ledger import DropReason
from megacpp_pipeline.core.schemas import git_blob_sha
from tests.fixtures.git_repo import git as _git

VECTOR_H = b"""// SPDX-License-Identifier: MIT
#pragma once
#include <cstddef>
namespace demo {
template <class T> class small_vector {
 public:
  std::size_t size() const noexcept { return size_; }
 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};
}  // namespace demo
"""
MAIN_CC = b'#include "vector.h"\nint main() { demo::small_vector<int> v; return (int)v.size(); }\n'


def _files(spec: SourceSpec, uri: str, tmp: Path, **kw: object) -> dict[str, collect.Entry]:
    sf = collect.open_source(spec, uri, cache_dir=tmp / "cache", limits=CollectLimits(**kw))  # type: ignore[arg-type]
    return {e.path: e for e in sf.entries() if not e.metadata_only}  # the files seen


@pytest.fixture
def two_commit_repo(tmp_path: Path) -> tuple[Path, str, str]:
    repo = tmp_path / "repo"
    (repo / "include").mkdir(parents=True)
    _git(repo.parent, "init", "-q", "-b", "main", str(repo))
    (repo / "include" / "vector.h").write_bytes(VECTOR_H)
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "first")
    first = _git(repo, "rev-parse", "HEAD")
    (repo / "include" / "vector.h").write_bytes(VECTOR_H.replace(b"size_ = 0", b"size_ = 1"))
    (repo / "main.cc").write_bytes(MAIN_CC)
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "second")
    second = _git(repo, "rev-parse", "HEAD")
    return repo, first, second


def test_git_collects_the_older_pinned_commit_not_head(
    two_commit_repo: tuple[Path, str, str], tmp_path: Path
) -> None:
    repo, first, _second = two_commit_repo
    spec = SourceSpec(id="demo", kind="git", uri=str(repo), revision=first)
    sf = collect.open_source(spec, str(repo), cache_dir=tmp_path / "c", limits=CollectLimits())
    files = {e.path: e for e in sf.entries()}
    assert sf.revision == first
    assert set(files) == {"include/vector.h"}
    assert files["include/vector.h"].content == VECTOR_H
    blob = _git(repo, "rev-parse", f"{first}:include/vector.h")
    assert git_blob_sha(VECTOR_H) == blob


def test_git_from_a_file_url_uses_a_bare_mirror_at_the_pinned_commit(
    two_commit_repo: tuple[Path, str, str], tmp_path: Path
) -> None:
    repo, _first, second = two_commit_repo
    spec = SourceSpec(id="demo", kind="git", uri=f"file://{repo}", revision=second)
    files = _files(spec, f"file://{repo}", tmp_path)
    assert set(files) == {"include/vector.h", "main.cc"}


def test_git_pinned_commit_that_does_not_exist_is_a_clear_error(
    two_commit_repo: tuple[Path, str, str], tmp_path: Path
) -> None:
    repo, _first, _second = two_commit_repo
    spec = SourceSpec(id="demo", kind="git", uri=str(repo), revision="0" * 40)
    with pytest.raises(collect.CollectError, match="pinned commit 0{40} does not exist"):
        _files(spec, str(repo), tmp_path)


def test_git_branch_is_resolved_to_a_commit_for_tracked_sources(
    two_commit_repo: tuple[Path, str, str],
) -> None:
    repo, _first, second = two_commit_repo
    assert collect.resolve_branch(str(repo), "main") == second


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_archive_with_a_wrong_sha256_is_refused_before_reading(tmp_path: Path) -> None:
    archive = tmp_path / "src.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("vector.h", VECTOR_H)
    spec = SourceSpec(id="demo", kind="archive", uri=str(archive), sha256="a" * 64)
    with pytest.raises(collect.CollectError, match="does not match the pinned"):
        _files(spec, str(archive), tmp_path)


def test_hostile_tar_members_are_refused_and_good_files_kept(tmp_path: Path) -> None:
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:

        def add(name: str, data: bytes = b"int x;\n", **attrs: object) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            for k, v in attrs.items():
                setattr(info, k, v)
            tf.addfile(info, io.BytesIO(data) if info.isreg() else None)

        add("include/vector.h", VECTOR_H)
        add("../escape.h")
        add("/etc/evil.h")
        add("include/passwd.h", b"", type=tarfile.SYMTYPE, linkname="/etc/passwd")
        add("include/up.h", b"", type=tarfile.SYMTYPE, linkname="../../../etc/shadow")
        add("include/inside.h", b"", type=tarfile.SYMTYPE, linkname="vector.h")
        add("include/dev.h", b"", type=tarfile.CHRTYPE)
        add("src/main.cc", MAIN_CC)
    spec = SourceSpec(id="demo", kind="archive", uri=str(archive), sha256=_sha(archive))
    files = _files(spec, str(archive), tmp_path)
    assert files["include/vector.h"].content == VECTOR_H
    assert files["src/main.cc"].content == MAIN_CC
    assert files["../escape.h"].reason == DropReason.UNSAFE_PATH
    assert files["/etc/evil.h"].reason == DropReason.UNSAFE_PATH
    assert files["include/passwd.h"].reason == DropReason.UNSAFE_PATH
    assert files["include/up.h"].reason == DropReason.UNSAFE_PATH
    assert files["include/inside.h"].reason == DropReason.SYMLINK
    assert files["include/dev.h"].reason == DropReason.UNSAFE_PATH
    assert not (tmp_path / "escape.h").exists()


def test_zip_bomb_member_is_refused_and_the_rest_kept(tmp_path: Path) -> None:
    archive = tmp_path / "bomb.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("include/vector.h", VECTOR_H)
        zf.writestr("include/bomb.h", b"\0" * (64 << 20))  # 64 MiB of zeros, ~64 KiB packed
        zf.writestr("../../zipslip.h", b"int y;\n")
        zf.writestr("src/main.cc", MAIN_CC)
    spec = SourceSpec(id="demo", kind="archive", uri=str(archive), sha256=_sha(archive))
    files = _files(spec, str(archive), tmp_path)
    assert files["include/bomb.h"].reason == DropReason.ARCHIVE_LIMIT
    assert "compression ratio" in (files["include/bomb.h"].detail or "")
    assert files["../../zipslip.h"].reason == DropReason.UNSAFE_PATH
    assert files["include/vector.h"].content == VECTOR_H
    assert files["src/main.cc"].content == MAIN_CC


def test_total_uncompressed_budget_bounds_an_archive(tmp_path: Path) -> None:
    archive = tmp_path / "many.tar"
    with tarfile.open(archive, "w") as tf:
        for i in range(5):
            data = VECTOR_H
            info = tarfile.TarInfo(f"f{i}.h")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    spec = SourceSpec(id="demo", kind="archive", uri=str(archive), sha256=_sha(archive))
    files = _files(spec, str(archive), tmp_path, max_total_bytes=len(VECTOR_H) * 3)
    kept = [p for p, e in files.items() if e.content is not None]
    limited = [p for p, e in files.items() if e.reason == DropReason.ARCHIVE_LIMIT]
    assert len(kept) == 3 and len(limited) == 2


def test_tar_zst_archives_are_read(tmp_path: Path) -> None:
    zstandard = pytest.importorskip("zstandard")
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tf:
        info = tarfile.TarInfo("vector.h")
        info.size = len(VECTOR_H)
        tf.addfile(info, io.BytesIO(VECTOR_H))
    archive = tmp_path / "src.tar.zst"
    archive.write_bytes(zstandard.ZstdCompressor().compress(raw.getvalue()))
    spec = SourceSpec(id="demo", kind="archive", uri=str(archive), sha256=_sha(archive))
    assert _files(spec, str(archive), tmp_path)["vector.h"].content == VECTOR_H


def test_dir_revision_is_a_tree_hash_that_changes_with_content(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    (root / "include").mkdir(parents=True)
    (root / "include" / "vector.h").write_bytes(VECTOR_H)
    (root / "README.md").write_text("not C++\n")
    (root / "include" / "link.h").symlink_to("/etc/passwd")
    spec = SourceSpec(id="demo", kind="dir", uri=str(root))
    sf = collect.open_source(spec, str(root), cache_dir=tmp_path, limits=CollectLimits())
    files = {e.path: e for e in sf.entries()}
    assert files["include/vector.h"].content == VECTOR_H
    assert files["README.md"].reason == DropReason.NOT_INCLUDED
    assert files["include/link.h"].reason == DropReason.SYMLINK
    first = sf.revision
    (root / "include" / "vector.h").write_bytes(VECTOR_H + b"\n")
    again = collect.open_source(spec, str(root), cache_dir=tmp_path, limits=CollectLimits())
    assert again.revision != first and len(first) == 64


def test_subdir_and_exclude_globs_scope_the_source(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    for rel in ("lib/include/a.h", "lib/include/detail/b.hpp", "lib/test/t.cc", "other/c.h"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(VECTOR_H)
    spec = SourceSpec(id="demo", kind="dir", uri=str(root), subdir="lib", exclude=["test/**"])
    files = _files(spec, str(root), tmp_path)
    kept = sorted(p for p, e in files.items() if e.content is not None)
    assert kept == ["include/a.h", "include/detail/b.hpp"]
    assert files["test/t.cc"].reason == DropReason.NOT_INCLUDED


def test_globs_match_at_any_depth_including_the_root() -> None:
    match = collect.PathFilter(["**/*.h", "include/c++/v1/*"], [])
    assert match("a.h") and match("x/y/a.h") and match("include/c++/v1/vector")
    assert not match("a.py") and not match("include/c++/v1/sub/vector")


def test_collect_batches_ledger_accounts_for_every_file_seen(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    root.mkdir()
    (root / "a.h").write_bytes(VECTOR_H)
    (root / "b.cc").write_bytes(MAIN_CC)
    (root / "notes.txt").write_text("x")
    (root / "REUSE.toml").write_text("version = 1\n")
    spec = SourceSpec(id="demo", kind="dir", uri=str(root))
    sf = collect.open_source(
        spec,
        str(root),
        cache_dir=tmp_path,
        limits=CollectLimits(),
        keep_also=lambda p: p == "REUSE.toml",
    )
    batches = list(collect.collect_batches(spec, sf, is_metadata=lambda p: p == "REUSE.toml"))
    kept = sum(b.kept.num_rows for b in batches)
    ledger = [r for b in batches for r in b.ledger.to_pylist()]
    meta = [r for b in batches for r in b.metadata.to_pylist()]
    assert kept == 2 and len(ledger) == 4
    assert sum(r["status"] == "kept" for r in ledger) == kept
    assert [m["path"] for m in meta] == ["REUSE.toml"]
    assert batches[0].kept["revision"][0].as_py() == sf.revision


def test_jsonl_source_keeps_good_records_and_ledgers_malformed_lines(tmp_path: Path) -> None:
    import json

    export = tmp_path / "export.jsonl"
    lines = [
        json.dumps({"path": "src/main.cc", "content": MAIN_CC.decode(), "license": "MIT"}),
        '{"path": "src/broken.cc", "content": 42}',
        "not json at all",
        json.dumps({"path": "../escape.h", "content": "int x;"}),
        json.dumps({"path": "include/vector.h", "content": VECTOR_H.decode()}),
    ]
    export.write_text("\n".join(lines) + "\n")
    spec = SourceSpec(id="dump", kind="jsonl", uri=str(export))
    files = _files(spec, str(export), tmp_path)
    assert files["include/vector.h"].content == VECTOR_H
    assert files["src/main.cc"].content == MAIN_CC
    assert files["../escape.h"].reason == DropReason.UNSAFE_PATH
    malformed = [e for e in files.values() if e.reason == DropReason.MALFORMED_RECORD]
    assert len(malformed) == 2
    assert any("export.jsonl:2: field 'content'" in (e.detail or "") for e in malformed)
    # whatever order the export's lines are in, the files come out in path order
    assert list(files) == sorted(files)
    # a record rejected for its content is named by its path; a line that is no JSON, by
    # its number
    assert list(files) == [
        "../escape.h",
        "<line 3>",
        "include/vector.h",
        "src/broken.cc",
        "src/main.cc",
    ]


def _entries(spec: SourceSpec, uri: str, tmp: Path) -> list[collect.Entry]:
    sf = collect.open_source(spec, uri, cache_dir=tmp / "cache", limits=CollectLimits())
    return list(sf.entries())


def test_an_encrypted_zip_member_is_that_files_problem_not_the_runs(tmp_path: Path) -> None:
    """zipfile raises RuntimeError for a member that needs a password: it failed the run."""
    archive = tmp_path / "locked.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("include/vector.h", VECTOR_H)
        zf.writestr("src/main.cc", MAIN_CC)
    data = bytearray(archive.read_bytes())
    for offset in (0, data.rindex(b"PK\x01\x02")):  # flag bit 0 (encrypted) on src/main.cc
        at = data.index(b"src/main.cc", offset) - (30 if offset == 0 else 46)
        flags = at + (6 if offset == 0 else 8)
        data[flags] |= 1
    archive.write_bytes(bytes(data))
    spec = SourceSpec(id="demo", kind="archive", uri=str(archive), sha256=_sha(archive))
    files = _files(spec, str(archive), tmp_path)
    assert files["include/vector.h"].content == VECTOR_H
    assert files["src/main.cc"].reason == DropReason.UNREADABLE


@pytest.mark.parametrize("name", ["broken.zip", "broken.tar.gz", "empty.tar"])
def test_an_archive_that_is_not_one_fails_naming_it(tmp_path: Path, name: str) -> None:
    archive = tmp_path / name
    archive.write_bytes(b"" if name == "empty.tar" else b"this is not an archive at all\n")
    spec = SourceSpec(id="demo", kind="archive", uri=str(archive), sha256=_sha(archive))
    with pytest.raises(collect.CollectError, match=name.replace(".", r"\.")):
        _files(spec, str(archive), tmp_path)


def _too_deep_to_list(root: Path) -> None:
    """`deep/` holding a file and a chain of folders whose path grows past PATH_MAX (made
    through folder descriptors): the walk cannot list the folders at the bottom, even as
    root (chmod 000 would not stop root)."""
    (root / "deep").mkdir()
    (root / "deep" / "top.h").write_bytes(MAIN_CC)
    fd = os.open(root / "deep", os.O_RDONLY)
    try:
        for _ in range(20):
            os.mkdir("d" * 250, dir_fd=fd)
            below = os.open("d" * 250, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = below
        leaf = os.open("lost.h", os.O_WRONLY | os.O_CREAT, dir_fd=fd)
        os.write(leaf, MAIN_CC)
        os.close(leaf)
    finally:
        os.close(fd)


def test_a_folder_that_cannot_be_listed_is_a_ledger_row_not_a_silent_loss(tmp_path: Path) -> None:
    """Its files cannot be named, so the folder takes the row that says why they are not
    collected; everything the walk could list is collected as before."""
    root = tmp_path / "tree"
    root.mkdir()
    (root / "keep.h").write_bytes(VECTOR_H)
    _too_deep_to_list(root)
    spec = SourceSpec(id="demo", kind="dir", uri=str(root))
    files = _files(spec, str(root), tmp_path)
    assert files["keep.h"].content == VECTOR_H
    assert files["deep/top.h"].content == MAIN_CC
    unlisted = [e for p, e in files.items() if e.reason == DropReason.UNREADABLE]
    assert len(unlisted) == 1, files.keys()
    assert unlisted[0].path.startswith("deep/" + "d" * 250 + "/")
    assert unlisted[0].detail is not None
    assert "cannot be listed" in unlisted[0].detail
    assert not any(p.endswith("lost.h") for p in files)


def _three_member_tar() -> tuple[bytes, int]:
    """A tar of three headers and the byte where its second member's header starts."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in (
            ("include/vector.h", VECTOR_H),
            ("src/a.cc", MAIN_CC),
            ("src/b.cc", MAIN_CC),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    second = 512 + -(-len(VECTOR_H) // 512) * 512
    return buf.getvalue(), second


@pytest.mark.parametrize(
    ("name", "damage"),
    [
        ("bad-checksum.tar", "checksum"),
        ("bad-checksum.tar.gz", "checksum"),
        ("cut-in-a-header.tar", "cut header"),
        ("cut-in-a-member.tar", "cut data"),
    ],
)
def test_a_damaged_tar_fails_naming_it_rather_than_ending_early(
    tmp_path: Path, name: str, damage: str
) -> None:
    """tarfile takes a damaged header past the first member for the archive's end: the
    members after it were lost with no ledger row and no error."""
    data, second = _three_member_tar()
    if damage == "checksum":
        damaged = bytearray(data)
        damaged[second + 148] ^= 0x11  # a digit of the header's checksum field
        data = bytes(damaged)
    elif damage == "cut header":
        data = data[: second + 200]
    else:
        data = data[: second + 512 + 20]
    archive = tmp_path / name
    archive.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    spec = SourceSpec(id="demo", kind="archive", uri=str(archive), sha256=_sha(archive))
    with pytest.raises(collect.CollectError, match=rf"{re.escape(name)}: damaged tar archive"):
        _files(spec, str(archive), tmp_path)
    with pytest.raises(collect.CollectError, match=re.escape(name)):
        collect.list_source(
            spec, str(archive), cache_dir=tmp_path / "cache", limits=CollectLimits()
        )


def test_a_tar_extended_header_is_bounded_but_long_names_still_read(tmp_path: Path) -> None:
    """tarfile reads a pax or GNU long-name header whole: one claiming gigabytes would
    take them. Past 1 MiB it fails naming the archive; a long name is a few hundred bytes."""
    long_name = "include/" + "n" * 300 + ".h"
    for fmt, name in ((tarfile.GNU_FORMAT, "gnu.tar"), (tarfile.PAX_FORMAT, "pax.tar")):
        archive = tmp_path / name
        with tarfile.open(archive, "w", format=fmt) as tf:
            info = tarfile.TarInfo(long_name)
            info.size = len(VECTOR_H)
            tf.addfile(info, io.BytesIO(VECTOR_H))
        spec = SourceSpec(id="demo", kind="archive", uri=str(archive), sha256=_sha(archive))
        assert _files(spec, str(archive), tmp_path)[long_name].content == VECTOR_H
    archive = tmp_path / "huge-pax.tar"
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tf:
        info = tarfile.TarInfo("src/a.cc")
        info.size = len(MAIN_CC)
        info.pax_headers = {"comment": "x" * (2 << 20)}
        tf.addfile(info, io.BytesIO(MAIN_CC))
    spec = SourceSpec(id="demo", kind="archive", uri=str(archive), sha256=_sha(archive))
    with pytest.raises(collect.CollectError, match=r"huge-pax\.tar: .*extended header of"):
        _files(spec, str(archive), tmp_path)


def test_a_tar_without_its_end_blocks_keeps_every_member(tmp_path: Path) -> None:
    """Some writers leave out the two zero blocks at the end: the data ends on a member's
    boundary, every member is whole, nothing is damaged."""
    data, _ = _three_member_tar()
    end = len(data.rstrip(b"\0"))
    archive = tmp_path / "no-end.tar"
    archive.write_bytes(data[: -(-end // 512) * 512])
    spec = SourceSpec(id="demo", kind="archive", uri=str(archive), sha256=_sha(archive))
    files = _files(spec, str(archive), tmp_path)
    assert {p: e.content for p, e in files.items()} == {
        "include/vector.h": VECTOR_H,
        "src/a.cc": MAIN_CC,
        "src/b.cc": MAIN_CC,
    }


def test_a_readable_copy_beside_an_unreadable_one_of_the_same_name_is_not_kept(
    tmp_path: Path,
) -> None:
    """Two members named alike, one over the size limit: neither is the one meant (an
    extraction keeps the last), so none is kept; each copy has its ledger row."""
    archive = tmp_path / "dups.tar"
    with tarfile.open(archive, "w") as tf:
        for data in (VECTOR_H, VECTOR_H * 40_000):
            info = tarfile.TarInfo("include/vector.h")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo("src/main.cc")
        info.size = len(MAIN_CC)
        tf.addfile(info, io.BytesIO(MAIN_CC))
    spec = SourceSpec(id="demo", kind="archive", uri=str(archive), sha256=_sha(archive))
    entries = _entries(spec, str(archive), tmp_path)
    copies = [e for e in entries if e.path == "include/vector.h"]
    assert len(copies) == 2 and all(e.content is None for e in copies)
    assert [e.content for e in entries if e.path == "src/main.cc"] == [MAIN_CC]


def test_jsonl_records_naming_one_path_are_all_dropped_as_ambiguous(tmp_path: Path) -> None:
    import json

    export = tmp_path / "export.jsonl"
    records = [("src/a.h", "int a;"), ("./src/a.h", "int b;"), ("src/main.cc", "int c;")]
    export.write_text("".join(json.dumps({"path": p, "content": c}) + "\n" for p, c in records))
    spec = SourceSpec(id="dump", kind="jsonl", uri=str(export))
    entries = _entries(spec, str(export), tmp_path)
    dups = [e for e in entries if e.path == "src/a.h"]
    assert len(dups) == 2 and {e.reason for e in dups} == {DropReason.UNSAFE_PATH}
    assert all("2 records share this path" in (e.detail or "") for e in dups)
    assert [e.content for e in entries if e.path == "src/main.cc"] == [b"int c;"]


def test_a_jsonl_line_longer_than_any_allowed_record_is_rejected_unread(tmp_path: Path) -> None:
    """The reader held a whole line in memory however long; past what a record of the
    largest allowed file can take (JSON escapes and all) it is now rejected by its line,
    skipped a block at a time, and the lines after it are read as usual."""
    import json

    export = tmp_path / "export.jsonl"
    limit = collect.max_record_bytes(100)
    huge = json.dumps({"path": "src/huge.h", "content": "x" * (limit + 10)})
    lines = [
        json.dumps({"path": "src/a.h", "content": "int a;"}),
        huge,
        json.dumps({"path": "src/big.h", "content": "y" * 500}),  # over 100, not over the line
        json.dumps({"path": "src/b.h", "content": "int b;"}),
    ]
    export.write_text("\n".join(lines) + "\n")
    spec = SourceSpec(id="dump", kind="jsonl", uri=str(export), max_file_bytes=100)
    sf = collect.open_source(
        spec, str(export), cache_dir=tmp_path / "c", limits=CollectLimits(), max_file_bytes=100
    )
    files = {e.path: e for e in sf.entries()}
    assert files["src/a.h"].content == b"int a;"
    assert files["src/b.h"].content == b"int b;"
    assert files["src/big.h"].reason == DropReason.TOO_LARGE
    long = files["<line 2>"]
    assert long.reason == DropReason.MALFORMED_RECORD
    assert f"line of {len(huge)} bytes is longer than the {limit}" in (long.detail or "")


def test_a_jsonl_line_of_exactly_the_longest_record_is_read_and_the_next_is_not_lost(
    tmp_path: Path,
) -> None:
    """A line whose bytes before its newline are exactly the limit was taken as too long, and
    skipping "the rest of it" swallowed the next record whole, with no ledger row."""
    import json

    limit = collect.max_record_bytes(100)
    head = json.dumps({"path": "src/exact.h", "content": ""})
    exact = json.dumps({"path": "src/exact.h", "content": "z" * (limit - len(head))})
    over = json.dumps({"path": "src/long1.h", "content": "z" * (limit - len(head) + 1)})
    assert len(exact) == limit and len(over) == limit + 1
    lines = [
        exact,
        json.dumps({"path": "src/lost.h", "content": "int lost;"}),
        over,
        json.dumps({"path": "src/b.h", "content": "int b;"}),
    ]
    export = tmp_path / "export.jsonl"
    export.write_text("\n".join(lines) + "\n")
    spec = SourceSpec(id="dump", kind="jsonl", uri=str(export), max_file_bytes=100)
    sf = collect.open_source(
        spec, str(export), cache_dir=tmp_path / "c", limits=CollectLimits(), max_file_bytes=100
    )
    files = {e.path: e for e in sf.entries()}
    assert files["src/exact.h"].reason == DropReason.TOO_LARGE  # read, and over 100 bytes
    assert files["src/lost.h"].content == b"int lost;"
    too_long = files["<line 3>"].detail or ""  # the line too long, by its number
    assert f"export.jsonl:3: field '<line>': line of {limit + 1} bytes" in too_long
    assert files["src/b.h"].content == b"int b;"


def test_a_pinned_jsonl_export_is_read_to_its_last_record_newline_or_not(
    tmp_path: Path,
) -> None:
    import json

    export = tmp_path / "export.jsonl"
    export.write_text(
        json.dumps({"path": "src/a.h", "content": "int a;"})
        + "\n"
        + json.dumps({"path": "src/last.h", "content": "int last;"})  # no newline after it
    )
    spec = SourceSpec(id="dump", kind="jsonl", uri=str(export))
    files = _files(spec, str(export), tmp_path)
    assert files["src/last.h"].content == b"int last;"
    assert list(files) == ["src/a.h", "src/last.h"]


def test_a_malformed_jsonl_record_is_named_by_the_path_it_meant(tmp_path: Path) -> None:
    """A record rejected for a field other than its path is ledgered under that path (so
    `megacpp explain` finds it); one naming the path of a good record makes both ambiguous;
    a line too deeply nested for the JSON reader is a malformed line, not a crash."""
    import json

    export = tmp_path / "export.jsonl"
    lines = [
        json.dumps({"path": "src/bad.h", "content": 7}),
        json.dumps({"path": "src/twice.h", "content": "int t;"}),
        json.dumps({"path": "./src/twice.h", "license": ["MIT"], "content": "int u;"}),
        '{"path": "src/deep.h", "content": "x", "extra": ' + "[" * 100_000 + "]" * 100_000 + "}",
        json.dumps({"path": "src/ok.h", "content": "int ok;"}),
    ]
    export.write_text("\n".join(lines) + "\n")
    spec = SourceSpec(id="dump", kind="jsonl", uri=str(export))
    entries = _entries(spec, str(export), tmp_path)
    by_path = {e.path: e for e in entries}
    bad = by_path["src/bad.h"]
    assert bad.reason == DropReason.MALFORMED_RECORD
    assert "export.jsonl:1: field 'content': a string expected, got int" in (bad.detail or "")
    twice = [e for e in entries if e.path == "src/twice.h"]
    assert {e.reason for e in twice} == {DropReason.MALFORMED_RECORD, DropReason.UNSAFE_PATH}
    deep = by_path["<line 4>"]
    assert deep.reason == DropReason.MALFORMED_RECORD and "nested deeper" in (deep.detail or "")
    assert by_path["src/ok.h"].content == b"int ok;"


def test_a_jsonl_records_licence_reaches_the_metadata_and_no_ledger_row(tmp_path: Path) -> None:
    """The record's `license` was checked and thrown away: a GPL record shipped under the
    source's declared MIT. It now travels with the source's metadata to the licence gate."""
    import json

    export = tmp_path / "export.jsonl"
    lines = [
        json.dumps({"path": "src/gpl.h", "content": "int g;", "license": "GPL-3.0-only"}),
        json.dumps({"path": "src/plain.h", "content": "int p;"}),
        json.dumps({"path": "../out.h", "content": "int o;", "license": "MIT"}),
    ]
    export.write_text("\n".join(lines) + "\n")
    spec = SourceSpec(id="dump", kind="jsonl", uri=str(export))
    files = collect.open_source(spec, str(export), cache_dir=tmp_path / "c", limits=CollectLimits())
    (batch,) = collect.collect_batches(spec, files, is_metadata=lambda _: False)
    assert batch.kept["path"].to_pylist() == ["src/gpl.h", "src/plain.h"]
    assert sorted(batch.ledger["path"].to_pylist()) == ["../out.h", "src/gpl.h", "src/plain.h"]
    meta = dict(
        zip(batch.metadata["path"].to_pylist(), batch.metadata["content"].to_pylist(), strict=True)
    )
    assert meta == {collect.record_license_path("src/gpl.h"): b"GPL-3.0-only"}


@pytest.mark.parametrize(
    ("name", "kind", "compress"),
    [("export.jsonl.gz", "gzip", gzip.compress), ("export.jsonl.xz", "xz", lzma.compress)],
)
def test_a_compressed_jsonl_export_is_refused_by_name(
    tmp_path: Path, name: str, kind: str, compress: Callable[[bytes], bytes]
) -> None:
    """It was read as text: every line rejected, and the source "collected" with no file."""
    export = tmp_path / name
    export.write_bytes(compress(b'{"path": "a.h", "content": "int a;"}\n'))
    spec = SourceSpec(id="dump", kind="jsonl", uri=str(export))
    with pytest.raises(collect.CollectError, match=rf"{name}: is {kind}-compressed"):
        collect.open_source(spec, str(export), cache_dir=tmp_path / "c", limits=CollectLimits())


# odd files named in the ledger ------------------------------------------------------------
ANNEX_KEY = "SHA256E-s1048576--9f2c0a51e1b7d3c4a6f8e0b2d4c6a8e0f2b4d6c8e0a2c4e6a8c0e2a4c6e8a0b2.h"
ANNEX_TARGET = f"../.git/annex/objects/Xk/Mv/{ANNEX_KEY}/{ANNEX_KEY}"


def _odd_tree(root: Path) -> None:
    """A non-UTF-8 name, a name spelled with that name's escapes, an annex link, a header."""
    (root / "inc").mkdir(parents=True)
    (root / "inc" / "vector.h").write_bytes(VECTOR_H)
    with open(os.fsencode(root / "inc") + b"/odd\xff.h", "wb") as f:
        f.write(VECTOR_H)
    (root / "inc" / "odd\\xff.h").write_bytes(VECTOR_H)  # a backslash, then "xff"
    # after odd\xff.h by its bytes (0x61 < 0xff), before it by its ledger path ('\\' < 'a')
    (root / "inc" / "odda.h").write_bytes(VECTOR_H)
    (root / "inc" / "notes.txt").write_bytes(b"not C++\n")
    (root / "inc" / "zz.txt").write_bytes(b"not C++ either\n")  # a drop after every header
    os.symlink(ANNEX_TARGET, root / "inc" / "table.h")


def _check_odd(files: dict[str, collect.Entry]) -> None:
    assert set(files) == {
        "inc/vector.h", "inc/odd\\xff.h", "inc/odd\\\\xff.h", "inc/odda.h", "inc/notes.txt",
        "inc/table.h", "inc/zz.txt",
    }  # fmt: skip
    # every file, dropped or kept, in the order of the paths the ledger holds: the snapshot
    # joins a source's ledgers by that order
    assert list(files) == sorted(files)
    not_utf8, literal = files["inc/odd\\xff.h"], files["inc/odd\\\\xff.h"]
    assert not_utf8.reason == DropReason.UNSAFE_PATH and "not UTF-8" in (not_utf8.detail or "")
    assert literal.reason == DropReason.UNSAFE_PATH and "backslash" in (literal.detail or "")
    assert collect.unescape_name("inc/odd\\xff.h") == b"inc/odd\xff.h"
    assert collect.unescape_name("inc/odd\\\\xff.h") == b"inc/odd\\xff.h"
    link = files["inc/table.h"]
    assert link.reason == DropReason.POINTER_FILE and ANNEX_KEY in (link.detail or "")


def test_odd_names_stay_apart_and_an_annex_link_is_named_in_a_dir_source(tmp_path: Path) -> None:
    _odd_tree(tmp_path / "src")
    spec = SourceSpec(id="demo", kind="dir", uri=str(tmp_path / "src"))
    _check_odd(_files(spec, str(tmp_path / "src"), tmp_path))


def test_odd_names_stay_apart_and_an_annex_link_is_named_in_a_git_source(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _git(tmp_path, "init", "-q", "-b", "main", str(repo))
    _odd_tree(repo)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "odd")
    spec = SourceSpec(
        id="demo", kind="git", uri=str(repo), revision=_git(repo, "rev-parse", "HEAD")
    )
    _check_odd(_files(spec, str(repo), tmp_path))


def test_a_tar_member_name_that_is_not_utf8_and_an_annex_link_are_named(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for name, data in (("inc/vector.h", VECTOR_H), ("inc/odd\udcff.h", VECTOR_H)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("inc/table.h")
        link.type, link.linkname = tarfile.SYMTYPE, ANNEX_TARGET
        tf.addfile(link)
    archive = tmp_path / "odd.tar"
    archive.write_bytes(buf.getvalue())
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    spec = SourceSpec(id="demo", kind="archive", uri=str(archive), sha256=sha)
    files = _files(spec, str(archive), tmp_path)
    assert set(files) == {"inc/vector.h", "inc/odd\\xff.h", "inc/table.h"}
    assert files["inc/odd\\xff.h"].reason == DropReason.UNSAFE_PATH
    assert files["inc/table.h"].reason == DropReason.POINTER_FILE


def test_one_size_policy_refuses_a_file_naming_the_setting_without_reading_past_it(
    tmp_path: Path,
) -> None:
    root = tmp_path / "src"
    root.mkdir()
    (root / "big.h").write_bytes(b"int x;\n" * 2000)
    (root / "small.h").write_bytes(VECTOR_H)
    spec = SourceSpec(id="demo", kind="dir", uri=str(root), max_file_bytes=4096)
    sf = collect.open_source(
        spec, str(root), cache_dir=tmp_path / "c", limits=CollectLimits(), max_file_bytes=4096
    )
    files = {e.path: e for e in sf.entries()}
    assert files["small.h"].content == VECTOR_H
    big = files["big.h"]
    assert big.reason == DropReason.TOO_LARGE and big.content is None
    assert big.detail is not None and "14000 bytes > max_file_bytes 4096" in big.detail


@pytest.mark.parametrize("size_then", [0, 5, 99, 100, 5000])
def test_a_file_is_read_to_its_end_whatever_size_it_had_when_stat_saw_it(
    tmp_path: Path, size_then: int
) -> None:
    """read_entry reads straight from the descriptor, sized by fstat: a file that grew or
    shrank after that is still read to its end, never past the limit."""
    from megacpp_pipeline.collect.directory import _read_at_most

    path = tmp_path / "f.h"
    path.write_bytes(bytes(range(256)) * 12)  # 3,072 bytes
    fd = os.open(path, os.O_RDONLY)
    try:
        assert _read_at_most(fd, size_then, 1 << 20) == path.read_bytes()
        os.lseek(fd, 0, os.SEEK_SET)
        assert _read_at_most(fd, size_then, 1001) == path.read_bytes()[:1001]
    finally:
        os.close(fd)
