"""Specification of removal requests: the `removals:` entries and request files, the gate that
drops what they name before scrub, and the promotion check's search for removed content and
near duplicates in a snapshot."""

from __future__ import annotations

import codecs
import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pytest
from pydantic import ValidationError

from megacpp_pipeline.core import schemas
from megacpp_pipeline.core.ledger import LEDGER_SCHEMA, DropReason
from megacpp_pipeline.corpus.dedup import DedupConfig
from megacpp_pipeline.gates.removals import (
    REMOVED_FILES_SCHEMA,
    Removal,
    RemovalError,
    RemovalSpec,
    find_in_snapshot,
    fingerprint,
    load_removals,
    raw_sha256,
    remaining_near_duplicates,
    run,
    violations,
)

RING_BUFFER = """// Copyright 2022 The Kestrel Authors
// SPDX-License-Identifier: MIT
#pragma once
#include <array>
#include <cstddef>

namespace kestrel {

template <typename T, std::size_t N>
class ring_buffer {
public:
    bool push(const T& value) {
        if (size_ == N) {
            return false;
        }
        items_[(head_ + size_) % N] = value;
        ++size_;
        return true;
    }

    bool pop(T& out) {
        if (size_ == 0) {
            return false;
        }
        out = items_[head_];
        head_ = (head_ + 1) % N;
        --size_;
        return true;
    }

    std::size_t size() const { return size_; }

private:
    std::array<T, N> items_{};
    std::size_t head_ = 0;
    std::size_t size_ = 0;
};

}  // namespace kestrel
"""
CLOCK = """// SPDX-License-Identifier: MIT
#pragma once
#include <chrono>

namespace kestrel {

inline double seconds_since(std::chrono::steady_clock::time_point start) {
    using seconds = std::chrono::duration<double>;
    return std::chrono::duration_cast<seconds>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace kestrel
"""
CONFIG = DedupConfig.model_validate({})


def licensed(
    files: dict[str, str | bytes], source: str = "kestrel", encoding: str = "utf-8"
) -> pa.Table:
    """A LICENSED_FILES table; bytes values are raw files whose text is their normalized
    decoding (BOM dropped, CRLF to LF), as normalize leaves it."""
    rows = []
    for path, value in sorted(files.items()):
        raw = value if isinstance(value, bytes) else value.encode()
        text = raw.decode("utf-8-sig").replace("\r\n", "\n") if isinstance(value, bytes) else value
        rows.append((path, raw, text))
    n = len(rows)
    return pa.table(
        {
            "source_id": [source] * n,
            "path": [p for p, _, _ in rows],
            "revision": ["0" * 40] * n,
            "blob_sha": [schemas.git_blob_sha(r) for _, r, _ in rows],
            "size": [len(r) for _, r, _ in rows],
            "encoding": [encoding if isinstance(files[p], bytes) else "utf-8" for p, _, _ in rows],
            "text": [t for _, _, t in rows],
            "content_sha256": [schemas.text_sha256(t) for _, _, t in rows],
            "language": ["c++"] * len(rows),
            "vendored": [False] * len(rows),
            "license_expression": ["MIT"] * n,
            "license_source": ["file"] * n,
            "license_decision": ["allowed"] * n,
            "license_detail": [None] * n,
        },
        schema=schemas.LICENSED_FILES,
    )


def removals(*entries: dict[str, str], base_dir: Path = Path(".")) -> list[Removal]:
    return load_removals(list(entries), base_dir)


# entries ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "entry",
    [
        {"source": "kestrel"},
        {"source": "kestrel", "path": "include/**/*.hpp", "reason": "author request 2026-11"},
        {"sha256": "A" * 64},
        {"file": "requests.jsonl"},
    ],
)
def test_each_form_of_entry_is_accepted(entry: dict[str, str]) -> None:
    spec = RemovalSpec.model_validate(entry)
    assert spec.sha256 in (None, "a" * 64)  # hex is compared lower-case


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({}, "exactly one of"),
        ({"source": "kestrel", "sha256": "a" * 64}, "has source and sha256"),
        ({"path": "a.hpp"}, "path needs source"),
        ({"sha256": "abc"}, "64 hex"),
        ({"source": "Kestrel Lib"}, "source id"),
        ({"source": "kestrel", "path": "../etc/passwd"}, "relative glob"),
        ({"source": "kestrel", "glob": "*.h"}, "glob"),
    ],
)
def test_a_bad_entry_is_refused_naming_the_problem(entry: dict[str, str], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        RemovalSpec.model_validate(entry)


def test_a_bad_entry_in_sources_yaml_names_its_position_and_field() -> None:
    with pytest.raises(RemovalError) as e:
        removals({"source": "kestrel"}, {"source": "kestrel", "paht": "a.h"})
    assert (e.value.origin, e.value.field) == ("sources.yaml removals[1]", "paht")
    assert "unknown key" in str(e.value)


def test_request_file_entries_are_expanded_in_place_with_file_and_line(tmp_path: Path) -> None:
    lines = [
        json.dumps({"source": "kestrel", "path": "src/ring_buffer.hpp"}),
        "",
        json.dumps({"sha256": "b" * 64, "reason": "DMCA 2026-114"}),
    ]
    (tmp_path / "requests.jsonl").write_text("\n".join(lines) + "\n")
    loaded = load_removals(
        [{"source": "other"}, {"file": "requests.jsonl", "reason": "queue export"}],
        tmp_path,
    )
    assert [r.origin for r in loaded] == [
        "sources.yaml removals[0]",
        f"{tmp_path / 'requests.jsonl'}:1",
        f"{tmp_path / 'requests.jsonl'}:3",
    ]
    assert loaded[1].spec.reason == "queue export"  # the file's reason, unless the line has one
    assert loaded[2].spec.reason == "DMCA 2026-114"


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("{not json", "(entry)"),
        (json.dumps({"sha256": "xyz"}), "sha256"),
        (json.dumps({"file": "more.jsonl"}), "file"),
        (json.dumps(["kestrel"]), "(entry)"),
    ],
)
def test_a_bad_request_line_names_the_file_line_and_field(
    tmp_path: Path, line: str, field: str
) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_text(json.dumps({"source": "kestrel"}) + "\n" + line + "\n")
    with pytest.raises(RemovalError) as e:
        load_removals([{"file": "requests.jsonl"}], tmp_path)
    assert (e.value.origin, e.value.field) == (f"{path}:2", field)


def test_a_missing_request_file_fails_naming_the_entry(tmp_path: Path) -> None:
    with pytest.raises(RemovalError, match=r"removals\[0\]: field file: cannot read"):
        load_removals([{"file": "gone.jsonl"}], tmp_path)


def test_an_entry_for_an_unknown_source_fails_before_any_work() -> None:
    with pytest.raises(RemovalError, match="no source 'kestral'"):
        load_removals([{"source": "kestral"}], Path("."), known_sources={"kestrel"})


# the gate -----------------------------------------------------------------------------------
def test_a_source_entry_removes_every_file_of_that_source_only() -> None:
    table = licensed({"a.hpp": RING_BUFFER, "b.hpp": CLOCK})
    entries = removals({"source": "kestrel"})
    assert run(table, entries, "kestrel").kept.num_rows == 0
    untouched = run(table, entries, "other")
    assert untouched.kept.equals(table) and untouched.dropped.num_rows == 0


@pytest.mark.parametrize(
    ("glob", "removed"),
    [
        ("include/ring_buffer.hpp", ["include/ring_buffer.hpp"]),
        ("include/*.hpp", ["include/ring_buffer.hpp"]),  # * stays inside a folder
        ("**/*.hpp", ["include/detail/clock.hpp", "include/ring_buffer.hpp"]),
        ("include/**", ["include/detail/clock.hpp", "include/ring_buffer.hpp"]),
        ("*.hpp", []),
        # a folder's files, however the folder is written
        ("include/detail", ["include/detail/clock.hpp"]),
        ("include/detail/", ["include/detail/clock.hpp"]),
        ("./include//ring_buffer.hpp", ["include/ring_buffer.hpp"]),
        ("include/ring", []),  # a folder is a whole name, not a prefix
    ],
)
def test_a_path_entry_is_a_glob_as_in_a_sources_include_list(glob: str, removed: list[str]) -> None:
    table = licensed({"include/ring_buffer.hpp": RING_BUFFER, "include/detail/clock.hpp": CLOCK})
    result = run(table, removals({"source": "kestrel", "path": glob}), "kestrel")
    assert sorted(result.dropped["path"].to_pylist()) == removed


def test_a_path_entry_matches_whichever_unicode_form_the_path_was_collected_in() -> None:
    """A path typed on Linux (NFC) names a file a macOS checkout collected as NFD."""
    nfd, nfc = "src/cafe\u0301.hpp", "src/caf\u00e9.hpp"
    table = licensed({nfd: RING_BUFFER, "src/other.hpp": CLOCK})
    result = run(table, removals({"source": "kestrel", "path": nfc}), "kestrel")
    assert result.dropped["path"].to_pylist() == [nfd]


def test_the_ledger_names_the_entry_that_matched_and_its_reason(tmp_path: Path) -> None:
    (tmp_path / "q.jsonl").write_text(
        json.dumps({"source": "kestrel", "path": "**/ring_*.hpp", "reason": "author request"})
    )
    table = licensed({"src/ring_buffer.hpp": RING_BUFFER, "src/clock.hpp": CLOCK})
    entries = load_removals([{"source": "other"}, {"file": "q.jsonl"}], tmp_path)
    result = run(table, entries, "kestrel")
    assert result.dropped.schema == LEDGER_SCHEMA
    row = result.dropped.to_pylist()[0]
    assert row["reason"] == DropReason.REMOVED_ON_REQUEST and row["stage"] == ""
    assert row["detail"] == (
        f"{tmp_path / 'q.jsonl'}:1: source kestrel path **/ring_*.hpp (reason: author request)"
    )
    assert result.kept["path"].to_pylist() == ["src/clock.hpp"]
    assert result.stats["removed_by:path"] == 1 and result.stats["kept"] == 1


def test_a_sha256_entry_removes_that_content_in_every_source() -> None:
    entries = removals({"sha256": schemas.text_sha256(RING_BUFFER)})
    for source in ("kestrel", "vendor-mirror"):
        table = licensed({"third_party/rb.hpp": RING_BUFFER, "clock.hpp": CLOCK}, source)
        assert run(table, entries, source).kept["path"].to_pylist() == ["clock.hpp"]


def test_a_sha256_entry_matches_the_raw_bytes_of_a_crlf_or_bom_file() -> None:
    crlf = RING_BUFFER.replace("\n", "\r\n").encode()
    bom = codecs.BOM_UTF8 + CLOCK.encode()
    table = pa.concat_tables(
        [licensed({"crlf.hpp": crlf}), licensed({"bom.hpp": bom}, encoding="utf-8-sig")]
    )
    by_raw = removals(
        {"sha256": hashlib.sha256(crlf).hexdigest()}, {"sha256": hashlib.sha256(bom).hexdigest()}
    )
    result = run(table, by_raw, "kestrel")
    assert sorted(result.dropped["path"].to_pylist()) == ["bom.hpp", "crlf.hpp"]
    removed = result.extra["removed"].to_pylist()
    assert {r["raw_sha256"] for r in removed} == {
        hashlib.sha256(crlf).hexdigest(),
        hashlib.sha256(bom).hexdigest(),
    }
    # and the hash of the normalized text, which documents.parquet shows, matches too
    by_text = removals({"sha256": schemas.text_sha256(RING_BUFFER)})
    assert run(table, by_text, "kestrel").dropped["path"].to_pylist() == ["crlf.hpp"]


def test_raw_bytes_are_only_trusted_when_the_git_blob_id_proves_them() -> None:
    raw = b"int a;\r\nint b;\nint c;\r\n"  # mixed line ends: not rebuildable
    text = raw.decode().replace("\r\n", "\n")
    assert raw_sha256(text, "utf-8", len(raw), schemas.git_blob_sha(raw)) is None
    utf16 = codecs.BOM_UTF16_LE + "int x = 1;\r\n".encode("utf-16-le")
    assert (
        raw_sha256("int x = 1;\n", "utf-16-le", len(utf16), schemas.git_blob_sha(utf16))
        == hashlib.sha256(utf16).hexdigest()
    )


def test_the_removed_table_holds_hashes_and_a_signature_never_the_text() -> None:
    table = licensed({"rb.hpp": RING_BUFFER, "clock.hpp": CLOCK})
    result = run(table, removals({"source": "kestrel", "path": "rb.hpp"}), "kestrel")
    removed = result.extra["removed"]
    assert removed.schema == REMOVED_FILES_SCHEMA
    row = removed.to_pylist()[0]
    assert row["content_sha256"] == schemas.text_sha256(RING_BUFFER)
    assert row["raw_sha256"] == row["content_sha256"]  # a UTF-8 LF file: the same bytes
    assert len(row["signature"]) == CONFIG.num_perm and row["matched_by"] == "path"
    assert "text" not in removed.column_names


def test_a_source_no_entry_touches_passes_through_unchanged() -> None:
    table = licensed({"rb.hpp": RING_BUFFER})
    result = run(table, removals({"source": "elsewhere", "path": "**"}), "kestrel")
    assert result.kept is table and result.extra["removed"].num_rows == 0


def test_adding_an_entry_for_one_source_leaves_the_others_fingerprint_alone() -> None:
    before = removals({"source": "a"})
    after = removals({"source": "a"}, {"source": "b", "path": "x.h"})
    assert fingerprint(before, "c") == fingerprint(after, "c")
    assert fingerprint(before, "b") != fingerprint(after, "b")
    with_content = removals({"source": "a"}, {"sha256": "c" * 64})
    assert fingerprint(with_content, "c") != fingerprint(before, "c")  # content is everywhere


# the promotion check --------------------------------------------------------------------------
def documents(rows: dict[str, str]) -> pa.Table:
    keys = list(rows)
    return pa.table(
        {
            "source_id": [k.split(":")[0] for k in keys],
            "path": [k.split(":")[1] for k in keys],
            "text": [rows[k] for k in keys],
            "content_sha256": [schemas.text_sha256(rows[k]) for k in keys],
        }
    )


def removed_ring_buffer() -> pa.Table:
    table = licensed({"include/ring_buffer.hpp": RING_BUFFER, "include/clock.hpp": CLOCK})
    entries = removals({"source": "kestrel", "path": "include/ring_buffer.hpp"})
    return run(table, entries, "kestrel").extra["removed"]


def test_a_clean_snapshot_has_no_finding() -> None:
    assert (
        find_in_snapshot(removed_ring_buffer(), documents({"kestrel:include/clock.hpp": CLOCK}))
        == []
    )


def test_the_removed_file_back_in_the_snapshot_is_a_violation() -> None:
    scrubbed = RING_BUFFER.replace("2022 The Kestrel Authors", "<AUTHOR>")
    findings = find_in_snapshot(
        removed_ring_buffer(), documents({"kestrel:include/ring_buffer.hpp": scrubbed})
    )
    assert [(f.kind, f.same_file, f.violation) for f in findings] == [("same_path", True, True)]
    assert "was removed by sources.yaml removals[0]" in findings[0].why


def test_an_exact_copy_elsewhere_is_a_violation_that_says_how_to_remove_it() -> None:
    findings = find_in_snapshot(
        removed_ring_buffer(), documents({"vendor:third_party/ring_buffer.hpp": RING_BUFFER})
    )
    assert [(f.kind, f.violation) for f in findings] == [("exact", True)]
    assert "a sha256 entry removes every copy" in findings[0].why
    assert violations(findings) == findings and remaining_near_duplicates(findings) == []


def test_an_exact_copy_scrub_changed_is_still_an_exact_copy_by_its_raw_bytes() -> None:
    """Scrub replaced an address in the copy, so its text hash is not the removed file's;
    its bytes as collected (the blob id every stage carries) are: still a violation."""
    scrubbed = RING_BUFFER.replace("2022 The Kestrel Authors", "<AUTHOR>")
    assert scrubbed != RING_BUFFER
    copy = documents({"vendor:third_party/ring_buffer.hpp": scrubbed}).append_column(
        "blob_sha", pa.array([schemas.git_blob_sha(RING_BUFFER.encode())])
    )
    findings = find_in_snapshot(removed_ring_buffer(), copy)
    assert [(f.kind, f.violation) for f in findings] == [("exact", True)]
    assert findings[0].removed == "kestrel:include/ring_buffer.hpp"


def test_a_near_duplicate_in_another_file_remains_and_the_report_says_why() -> None:
    edited = RING_BUFFER.replace("ring_buffer", "bounded_queue").replace("// Copyright 2022", "//")
    findings = find_in_snapshot(
        removed_ring_buffer(),
        documents({"vendor:queue.hpp": edited, "kestrel:include/clock.hpp": CLOCK}),
        CONFIG,
    )
    assert violations(findings) == []
    [near] = remaining_near_duplicates(findings)
    assert (near.kept, near.removed, near.kind) == (
        "vendor:queue.hpp",
        "kestrel:include/ring_buffer.hpp",
        "near",
    )
    assert near.similarity is not None and near.similarity >= CONFIG.threshold
    assert "is another file, a near duplicate" in near.why


def test_content_a_sha256_entry_named_is_a_violation_even_if_no_file_was_removed() -> None:
    findings = find_in_snapshot(
        removed_ring_buffer().slice(0, 0),
        documents({"vendor:rb.hpp": RING_BUFFER}),
        requested={schemas.text_sha256(RING_BUFFER)},
    )
    assert [(f.kind, f.violation) for f in findings] == [("exact", True)]


def test_signatures_must_come_from_the_same_dedup_config() -> None:
    with pytest.raises(ValueError, match="signed with 256 slots"):
        find_in_snapshot(
            removed_ring_buffer(),
            documents({"v:x.hpp": CLOCK}),
            DedupConfig.model_validate({"num_perm": 128, "bands": 16}),
        )


def test_the_stage_rescan_names_a_kept_file_an_entry_still_matches() -> None:
    from megacpp_pipeline.stages.removals import _AGAIN

    table = licensed({"a.hpp": RING_BUFFER, "b.hpp": CLOCK})
    entries = removals({"source": "kestrel", "path": "a.hpp"})
    found = _AGAIN.inspect((entries, "kestrel", None), table)
    assert len(found) == 1 and found[0].startswith("a.hpp: ")
    assert _AGAIN.inspect((entries, "other", None), table) == []
    kept = run(table, entries, "kestrel").kept
    assert _AGAIN.inspect((entries, "kestrel", None), kept) == []
