"""The per-file result cache: a refresh recomputes only changed files, gives the same output
as a cold run, and a config or code change invalidates exactly its stage."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from megacpp_pipeline.core.gate import GateResult
from megacpp_pipeline.core.ledger import LEDGER_SCHEMA, drops
from megacpp_pipeline.core.schemas import NORMALIZED_FILES, RAW_FILES, git_blob_sha, text_digests
from megacpp_pipeline.gates import normalize
from megacpp_pipeline.storage.file_cache import FileResultCache, cached_gate_call, row_keys

SCHEMAS = {"kept": NORMALIZED_FILES, "dropped": LEDGER_SCHEMA}


def _raw(files: dict[str, bytes]) -> pa.Table:
    paths = sorted(files)
    return pa.table(
        {
            "source_id": ["demo"] * len(paths),
            "path": paths,
            "revision": ["r"] * len(paths),
            "blob_sha": [git_blob_sha(files[p]) for p in paths],
            "size": [len(files[p]) for p in paths],
            "content": [files[p] for p in paths],
        },
        schema=RAW_FILES,
    )


def _corpus(n: int = 40) -> dict[str, bytes]:
    files = {
        f"include/m{i}.hpp": (
            f"#pragma once\nnamespace m{i} {{\ninline int value() {{ return {i}; }}\n}}\n"
        ).encode()
        for i in range(n)
    }
    files["include/blob.h"] = b"\x00\x01\x02" * 50  # dropped as binary: cached as a drop too
    return files


class CountingGate:
    """The real normalize gate, counting how many files it actually saw."""

    def __init__(self, config: normalize.NormalizeConfig) -> None:
        self.config = config
        self.files_seen = 0

    def __call__(self, table: pa.Table) -> GateResult:
        self.files_seen += table.num_rows
        return normalize.run(table, self.config)


def _call(cache: FileResultCache, table: pa.Table, gate: CountingGate) -> GateResult:
    result, _hits = cached_gate_call(cache, table, row_keys(table, "blob_sha"), gate, SCHEMAS)
    return result


def test_a_refresh_with_one_changed_file_recomputes_only_that_file(tmp_path: Path) -> None:
    cfg = normalize.NormalizeConfig()
    cache = FileResultCache(tmp_path, "normalize", "code-1", "cfg-1")
    files = _corpus()
    cold_gate = CountingGate(cfg)
    cold = _call(cache, _raw(files), cold_gate)
    assert cold_gate.files_seen == 41
    assert cold.kept.num_rows == 40 and cold.dropped.num_rows == 1

    files["include/m7.hpp"] = b"#pragma once\nint changed() { return 7; }\n"
    warm_gate = CountingGate(cfg)
    warm = _call(FileResultCache(tmp_path, "normalize", "code-1", "cfg-1"), _raw(files), warm_gate)
    assert warm_gate.files_seen == 1
    reference = normalize.run(_raw(files), cfg)
    assert warm.kept.equals(reference.kept)
    assert warm.dropped.equals(reference.dropped)


def test_a_fully_cached_run_gives_the_cold_output_without_calling_the_gate(
    tmp_path: Path,
) -> None:
    cfg = normalize.NormalizeConfig()
    table = _raw(_corpus())
    cold = _call(FileResultCache(tmp_path, "normalize", "c", "k"), table, CountingGate(cfg))
    gate = CountingGate(cfg)
    warm = _call(FileResultCache(tmp_path, "normalize", "c", "k"), table, gate)
    assert gate.files_seen == 0
    assert warm.kept.equals(cold.kept) and warm.dropped.equals(cold.dropped)


def test_config_or_code_change_invalidates_exactly_that_stage(tmp_path: Path) -> None:
    cfg = normalize.NormalizeConfig()
    table = _raw(_corpus(10))
    _call(FileResultCache(tmp_path, "normalize", "c1", "k1"), table, CountingGate(cfg))
    _call(FileResultCache(tmp_path, "scrub", "c1", "k1"), table, CountingGate(cfg))
    for code, conf in (("c2", "k1"), ("c1", "k2")):
        gate = CountingGate(cfg)
        _call(FileResultCache(tmp_path, "normalize", code, conf), table, gate)
        assert gate.files_seen == 11
    untouched = CountingGate(cfg)
    _call(FileResultCache(tmp_path, "scrub", "c1", "k1"), table, untouched)
    assert untouched.files_seen == 0


def test_an_entry_without_its_index_file_is_a_miss(tmp_path: Path) -> None:
    cfg = normalize.NormalizeConfig()
    table = _raw(_corpus(5))
    cache = FileResultCache(tmp_path, "normalize", "c", "k")
    _call(cache, table, CountingGate(cfg))
    for index in Path(cache.dir).glob("e-*.arrow"):
        if index.name.count(".") == 1:
            index.unlink()  # as if the process died before writing it
    gate = CountingGate(cfg)
    _call(FileResultCache(tmp_path, "normalize", "c", "k"), table, gate)
    assert gate.files_seen == 6


# entries prove themselves -------------------------------------------------------------------
def _entry_files(cache: FileResultCache) -> dict[str, Path]:
    """An entry's objects by kind ("index" for the index) of a cache holding one entry."""
    files = sorted(Path(cache.dir).glob("e-*.arrow"))
    return {(p.name.split(".")[1] if p.name.count(".") == 2 else "index"): p for p in files}


def _warm(tmp_path: Path, table: pa.Table, caplog: pytest.LogCaptureFixture) -> tuple:
    cfg = normalize.NormalizeConfig()
    gate = CountingGate(cfg)
    with caplog.at_level("WARNING", logger="megacpp_pipeline"):
        result = _call(FileResultCache(tmp_path, "normalize", "c", "k"), table, gate)
    return result, gate, [r.getMessage() for r in caplog.records]


def test_changed_bytes_inside_an_entry_are_discarded_with_one_warning_and_recomputed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    table = _raw(_corpus(5))
    cache = FileResultCache(tmp_path, "normalize", "c", "k")
    cold = _call(cache, table, CountingGate(normalize.NormalizeConfig()))
    kept = _entry_files(cache)["kept"]
    data = kept.read_bytes()
    kept.write_bytes(data.replace(b"return 3;", b"return 9;"))  # still a valid Arrow file
    warm, gate, warnings = _warm(tmp_path, table, caplog)
    assert gate.files_seen == 6  # the entry's files went through the gate again
    assert warm.kept.equals(cold.kept) and b"return 9;" not in str(warm.kept).encode()
    [line] = warnings
    index = kept.with_name(kept.name.replace(".kept", ""))
    assert line.startswith(f"{index}: result cache entry discarded") and "sha256" in line, line
    assert "demo:include/m0.hpp" in line


@pytest.mark.parametrize("damage", ["truncated part", "emptied part", "truncated index"])
def test_an_unreadable_or_emptied_entry_is_discarded_and_its_files_recomputed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    table = _raw(_corpus(5))
    cache = FileResultCache(tmp_path, "normalize", "c", "k")
    cold = _call(cache, table, CountingGate(normalize.NormalizeConfig()))
    files = _entry_files(cache)
    if damage == "truncated part":
        files["kept"].write_bytes(files["kept"].read_bytes()[:100])  # "Not an Arrow file"
    elif damage == "emptied part":
        for kind in ("kept", "dropped"):
            t = pa.ipc.open_file(pa.memory_map(str(files[kind]))).read_all().slice(0, 0)
            with pa.ipc.new_file(str(files[kind]), t.schema) as w:
                w.write_table(t)
    else:
        files["index"].write_bytes(files["index"].read_bytes()[:64])
    warm, gate, warnings = _warm(tmp_path, table, caplog)
    assert gate.files_seen == 6
    assert warm.kept.equals(cold.kept) and warm.dropped.equals(cold.dropped)
    assert len(warnings) == 1 and "result cache entry discarded" in warnings[0], warnings
    assert str(files["index"]) in warnings[0]
    again, gate, _ = _warm(tmp_path, table, caplog)  # the recomputed entry serves the next run
    assert gate.files_seen == 0 and again.kept.equals(cold.kept)


def test_an_entry_that_decides_no_file_cannot_prove_itself_even_with_matching_hashes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A consistent entry (its index records its parts' hashes) that decides none of its
    files: `54 files in, 0 kept + 0 in the ledger` must not come out of a cache."""
    import json

    from megacpp_pipeline.storage import file_cache

    table = _raw(_corpus(5))
    cache = FileResultCache(tmp_path, "normalize", "c", "k")
    cold = _call(cache, table, CountingGate(normalize.NormalizeConfig()))
    files = _entry_files(cache)
    index = pa.ipc.open_file(pa.memory_map(str(files["index"]))).read_all()
    parts = json.loads(index.schema.metadata[b"megacpp.cache.parts"])
    for kind in ("kept", "dropped"):
        t = pa.ipc.open_file(pa.memory_map(str(files[kind]))).read_all().slice(0, 0)
        data = file_cache._ipc_bytes(t)
        files[kind].write_bytes(data.to_pybytes())
        parts[kind] = {"bytes": data.size, "sha256": hashlib.sha256(data).hexdigest(), "rows": 0}
    meta = {**index.schema.metadata, b"megacpp.cache.parts": json.dumps(parts).encode()}
    files["index"].write_bytes(file_cache._ipc_bytes(index.replace_schema_metadata(meta)))
    warm, gate, warnings = _warm(tmp_path, table, caplog)
    assert gate.files_seen == 6 and warm.kept.equals(cold.kept)
    assert "do not decide each of its files once" in warnings[0]


def _rewrite_index(files: dict[str, Path], edit: Callable[[pa.Table], pa.Table]) -> None:
    from megacpp_pipeline.storage import file_cache

    index = pa.ipc.open_file(pa.memory_map(str(files["index"]))).read_all()
    files["index"].write_bytes(file_cache._ipc_bytes(edit(index)).to_pybytes())


def test_an_index_that_lists_a_key_twice_cannot_prove_itself(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    table = _raw(_corpus(3))
    cache = FileResultCache(tmp_path, "normalize", "c", "k")
    cold = _call(cache, table, CountingGate(normalize.NormalizeConfig()))
    _rewrite_index(
        _entry_files(cache),
        lambda t: pa.concat_tables([t, t.slice(0, 1)]).replace_schema_metadata(t.schema.metadata),
    )
    warm, gate, warnings = _warm(tmp_path, table, caplog)
    assert gate.files_seen == 4 and warm.kept.equals(cold.kept)
    assert "lists a key twice" in warnings[0]


def test_a_recorded_material_that_is_not_the_inputs_is_hashed_and_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A served key's recorded material equal to the input's is proven by that equality (the
    key is its hash, computed here); one that differs is hashed, and a key that is not its
    hash rejects the entry, as before."""
    table = _raw(_corpus(3))
    cache = FileResultCache(tmp_path, "normalize", "c", "k")
    _call(cache, table, CountingGate(normalize.NormalizeConfig()))

    def edit(t: pa.Table) -> pa.Table:
        material = t["material"].to_pylist()
        material[1] = material[1] + "x"
        i = t.schema.get_field_index("material")
        return t.set_column(i, t.schema.field(i), pa.array(material, t.schema.field(i).type))

    _rewrite_index(_entry_files(cache), edit)
    _, gate, warnings = _warm(tmp_path, table, caplog)
    assert gate.files_seen == 4
    assert "is not the hash of what the entry records for it" in warnings[0]


def test_an_entry_recorded_for_another_file_or_code_version_is_not_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    table = _raw(_corpus(3))
    old = FileResultCache(tmp_path, "normalize", "c-old", "k")
    _call(old, table, CountingGate(normalize.NormalizeConfig()))
    new = FileResultCache(tmp_path, "normalize", "c", "k")
    for path in Path(old.dir).glob("e-*.arrow"):  # an entry copied into another namespace
        (Path(new.dir) / path.name).write_bytes(path.read_bytes())
    _, gate, warnings = _warm(tmp_path, table, caplog)
    assert gate.files_seen == 4
    assert "written by code version 'c-old'" in warnings[0]


def test_a_text_changed_under_the_same_content_hash_is_another_key() -> None:
    """Enrich's cache key is not the upstream's claim about the text (`content_sha256`) but
    the row it parses: a changed text is recomputed even where the claim did not change."""
    from megacpp_pipeline.core.schemas import NORMALIZED_FILES

    cfg = normalize.NormalizeConfig()
    rows = normalize.run(_raw(_corpus(3)), cfg).kept
    assert rows.schema.equals(NORMALIZED_FILES)
    texts = rows["text"].to_pylist()
    texts[1] = texts[1].replace("return 1;", "return 7;")
    edited = rows.set_column(rows.schema.get_field_index("text"), "text", pa.array(texts))
    before = row_keys(rows, "content_sha256")
    after = row_keys(edited, "content_sha256")
    assert before[0] == after[0] and before[2] == after[2] and before[1] != after[1]
    revision = rows.set_column(
        rows.schema.get_field_index("revision"), "revision", pa.array(["r2"] * rows.num_rows)
    )
    assert row_keys(revision, "content_sha256") == before  # where it came from: not a key


def test_a_refresh_at_a_new_revision_reuses_every_result_stamped_with_the_new_revision(
    tmp_path: Path,
) -> None:
    cfg = normalize.NormalizeConfig()
    files = _corpus(5)
    _call(FileResultCache(tmp_path, "normalize", "c", "k"), _raw(files), CountingGate(cfg))
    moved = _raw(files)
    moved = moved.set_column(
        moved.schema.get_field_index("revision"),
        moved.schema.field("revision"),
        pa.array(["r2"] * moved.num_rows),
    )
    gate = CountingGate(cfg)
    warm = _call(FileResultCache(tmp_path, "normalize", "c", "k"), moved, gate)
    assert gate.files_seen == 0
    assert set(warm.kept["revision"].to_pylist()) == {"r2"}
    assert warm.kept.equals(normalize.run(moved, cfg).kept)


def _classified(table: pa.Table, *, change: str | None = None) -> GateResult:
    """A gate that adds a column to each row of normalized text and drops one file; with
    `change`, it also rewrites that file's text (as scrub would)."""
    kept = table.filter(pa.compute.not_equal(table["path"], "include/m3.hpp"))
    if change is not None:
        text = [
            t + "// scrubbed\n" if p == change else t
            for p, t in zip(kept["path"].to_pylist(), kept["text"].to_pylist(), strict=True)
        ]
        kept = kept.set_column(kept.schema.get_field_index("text"), "text", pa.array(text))
    kept = kept.append_column("lines", pa.array([t.count("\n") for t in kept["text"].to_pylist()]))
    dropped = table.filter(pa.compute.equal(table["path"], "include/m3.hpp"))
    return GateResult(
        kept=kept,
        dropped=drops(
            dropped["source_id"].to_pylist(),
            dropped["path"].to_pylist(),
            ["low_quality"] * dropped.num_rows,
        ),
    )


def _kept_parts(cache: FileResultCache) -> list[pa.Table]:
    return [
        pa.ipc.open_file(pa.memory_map(str(p))).read_all()
        for p in sorted(Path(cache.dir).glob("e-*.kept.arrow"))
    ]


def _kept_part_columns(cache: FileResultCache) -> list[list[str]]:
    return [part.column_names for part in _kept_parts(cache)]


@pytest.mark.parametrize("change", [None, "include/m5.hpp"])
def test_text_a_gate_only_read_is_not_copied_into_its_entry_and_a_hit_takes_the_inputs(
    tmp_path: Path, change: str | None
) -> None:
    normalized = normalize.run(_raw(_corpus()), normalize.NormalizeConfig()).kept
    schema = NORMALIZED_FILES.append(pa.field("lines", pa.int64()))
    schemas = {"kept": schema, "dropped": LEDGER_SCHEMA}
    keys = row_keys(normalized, "content_sha256")
    calls: list[int] = []

    def gate(table: pa.Table) -> GateResult:
        calls.append(table.num_rows)
        return _classified(table, change=change)

    cold, _ = cached_gate_call(
        FileResultCache(tmp_path, "classify", "c", ""), normalized, keys, gate, schemas
    )
    (columns,) = _kept_part_columns(FileResultCache(tmp_path, "classify", "c", ""))
    # the text stays in the entry only when the gate changed it, and then only the text of
    # the file it changed (the others' left to the input, as the mask beside it says)
    assert ("text" in columns) == (change is not None)
    assert {"source_id", "path", "lines"} <= set(columns)
    if change is not None:
        (part,) = _kept_parts(FileResultCache(tmp_path, "classify", "c", ""))
        held = part.filter(pc.is_valid(part["text"]))
        assert held["path"].to_pylist() == [change]
        assert part["_carried:text"].to_pylist() == [p != change for p in part["path"].to_pylist()]
    warm, hits = cached_gate_call(
        FileResultCache(tmp_path, "classify", "c", ""), normalized, keys, gate, schemas
    )
    assert calls == [normalized.num_rows] and hits == normalized.num_rows
    assert warm.kept.equals(cold.kept) and warm.dropped.equals(cold.dropped)
    if change is not None:
        (text,) = warm.kept.filter(pa.compute.equal(warm.kept["path"], change))["text"].to_pylist()
        assert text.endswith("// scrubbed\n")


def test_entries_that_left_different_columns_to_the_input_serve_one_call(tmp_path: Path) -> None:
    normalized = normalize.run(_raw(_corpus()), normalize.NormalizeConfig()).kept
    schemas = {
        "kept": NORMALIZED_FILES.append(pa.field("lines", pa.int64())),
        "dropped": LEDGER_SCHEMA,
    }
    keys = row_keys(normalized, "content_sha256")
    first, rest = normalized.slice(0, 20), normalized.slice(20)

    def gate(table: pa.Table) -> GateResult:  # rewrites one file's text, in the first half
        return _classified(table, change="include/m12.hpp")

    cache = FileResultCache(tmp_path, "classify", "c", "")
    cached_gate_call(cache, first, keys[:20], gate, schemas)  # the text kept in the entry
    cached_gate_call(cache, rest, keys[20:], gate, schemas)  # the text left to the input
    assert sorted("text" in c for c in _kept_part_columns(cache)) == [False, True]
    warm, hits = cached_gate_call(
        FileResultCache(tmp_path, "classify", "c", ""), normalized, keys, gate, schemas
    )
    assert hits == normalized.num_rows
    cold, _ = cached_gate_call(
        FileResultCache(tmp_path / "cold", "classify", "c", ""), normalized, keys, gate, schemas
    )
    assert warm.kept.equals(cold.kept) and warm.dropped.equals(cold.dropped)


def test_list_columns_are_keyed_by_their_values_wherever_they_sit() -> None:
    """Token ids and chunk lists are hashed from their buffers: a row's key depends on its
    lists' values (every boundary included), not on the chunk or slice the row sits in."""
    rows = {
        "source_id": ["s"] * 5,
        "path": [f"f{i}.hpp" for i in range(5)],
        "content_sha256": ["h"] * 5,
        "ids": [[1, 2], [3], [4, 5, 6], None, []],
        "names": [["ab", "c"], ["a", "bc"], ["x"], [], None],
    }
    schema = pa.schema(
        [
            ("source_id", pa.string()),
            ("path", pa.string()),
            ("content_sha256", pa.string()),
            ("ids", pa.list_(pa.int32())),
            ("names", pa.list_(pa.string())),
        ]
    )
    table = pa.table(rows, schema=schema)
    keys = row_keys(table, "content_sha256")
    # the same rows, sliced out and re-chunked: the same keys
    rechunked = pa.concat_tables([table.slice(0, 2), table.slice(2)])
    assert rechunked["ids"].num_chunks == 2
    assert row_keys(rechunked, "content_sha256") == keys
    assert row_keys(table.slice(2), "content_sha256") == keys[2:]

    def key_with(column: str, value: object, row: int = 0) -> str:
        changed = dict(rows)
        changed[column] = [value if i == row else v for i, v in enumerate(rows[column])]
        changed["path"] = ["f0.hpp"] * 5  # only the list differs from row 0's
        return row_keys(pa.table(changed, schema=schema), "content_sha256")[row]

    base = key_with("ids", [1, 2])
    assert key_with("ids", [1, 2]) == base
    assert key_with("ids", [1, 3]) != base  # a value
    assert key_with("ids", [1, 2, 0]) != base  # a count
    assert key_with("names", ["a", "bc"]) != base  # a boundary between strings
    assert key_with("names", ["abc"]) != base
    assert key_with("ids", None) != key_with("ids", [])  # a null list is not an empty one
    # a list with a null inside is still keyed (through its Python values)
    assert key_with("ids", [1, None]) != key_with("ids", [1, 0])


def test_large_lists_are_keyed_like_lists_of_the_same_values() -> None:
    """64-bit offsets (large_list, large_string) give a row the same key as the same values
    with 32-bit ones, and a value still moves it."""
    ids = [[1, 2, 3], [], [7]]
    names = [["a", "bc"], ["d"], []]

    def table(large: bool, first: int = 1) -> pa.Table:
        lst = pa.large_list if large else pa.list_
        text = pa.large_string() if large else pa.string()
        return pa.table(
            {
                "source_id": ["s"] * 3,
                "path": ["a.h", "b.h", "c.h"],
                "content_sha256": ["h"] * 3,
                "ids": pa.array([[first, *ids[0][1:]], *ids[1:]], lst(pa.int64())),
                "names": pa.array(names, lst(text)),
            }
        )

    keys = row_keys(table(large=False), "content_sha256")
    assert row_keys(table(large=True), "content_sha256") == keys
    moved = row_keys(table(large=True, first=9), "content_sha256")
    assert moved[0] != keys[0] and moved[1:] == keys[1:]


def test_scalar_columns_are_keyed_by_value_null_and_type_of_layout() -> None:
    """Numbers, booleans and strings are laid out from their buffers: a null is not a zero,
    an empty string or False; a dictionary column keys like its decoded values; a value
    moved between two string columns moves the key; a sliced table keys like its rows."""
    schema = pa.schema(
        [
            ("source_id", pa.string()),
            ("path", pa.string()),
            ("content_sha256", pa.string()),
            ("size", pa.int64()),
            ("ratio", pa.float32()),
            ("vendored", pa.bool_()),
            ("a", pa.string()),
            ("b", pa.string()),
        ]
    )
    base = {
        "source_id": "s", "path": "f.hpp", "content_sha256": "h", "size": 0,
        "ratio": 0.5, "vendored": False, "a": "ab", "b": "",
    }  # fmt: skip

    def key(**changed: object) -> str:
        row = {**base, **changed}
        return row_keys(pa.Table.from_pylist([row], schema=schema), "content_sha256")[0]

    k = key()
    assert key() == k
    variants = [
        key(size=None), key(size=1), key(ratio=None), key(ratio=0.25), key(vendored=None),
        key(vendored=True), key(a=None), key(a=""), key(b=None), key(a="a", b="b"),
    ]  # fmt: skip
    assert len({k, *variants}) == len(variants) + 1

    rows = pa.Table.from_pylist(
        [{**base, "path": f"f{i}.hpp", "size": i, "a": None if i % 3 else "x"} for i in range(7)],
        schema=schema,
    )
    keys = row_keys(rows, "content_sha256")
    assert row_keys(rows.slice(3), "content_sha256") == keys[3:]
    encoded = rows.set_column(
        rows.schema.get_field_index("a"), "a", pc.dictionary_encode(rows["a"])
    )
    assert row_keys(encoded, "content_sha256") == keys


def test_a_gate_that_rewrites_most_files_keeps_their_text_in_its_entry(tmp_path: Path) -> None:
    """Under half the rows as the input holds them: the column is stored whole, no mask."""
    normalized = normalize.run(_raw(_corpus()), normalize.NormalizeConfig()).kept
    schemas = {"kept": NORMALIZED_FILES, "dropped": LEDGER_SCHEMA}
    keys = row_keys(normalized, "content_sha256")

    def gate(table: pa.Table) -> GateResult:
        text = [t + "// seen\n" if i % 3 else t for i, t in enumerate(table["text"].to_pylist())]
        kept = table.set_column(table.schema.get_field_index("text"), "text", pa.array(text))
        return GateResult(kept=kept, dropped=LEDGER_SCHEMA.empty_table())

    cold, _ = cached_gate_call(
        FileResultCache(tmp_path, "mark", "c", ""), normalized, keys, gate, schemas
    )
    (part,) = _kept_parts(FileResultCache(tmp_path, "mark", "c", ""))
    assert "_carried:text" not in part.column_names
    assert part["text"].null_count == 0
    warm, hits = cached_gate_call(
        FileResultCache(tmp_path, "mark", "c", ""), normalized, keys, gate, schemas
    )
    assert hits == normalized.num_rows and warm.kept.equals(cold.kept)


def _normalize_call(cache: FileResultCache, raw: pa.Table, gate: CountingGate) -> GateResult:
    keys = row_keys(raw, "blob_sha")
    result, _ = cached_gate_call(cache, raw, keys, gate, SCHEMAS, {"text": "content"})
    return result


def test_normalized_text_that_is_its_files_bytes_is_left_to_the_raw_content(
    tmp_path: Path,
) -> None:
    """Normalize's text is the file's bytes for a file already UTF-8 and LF: its entry keeps
    only the text it changed (a CRLF file's), and a hit decodes the rest from the input."""
    files = _corpus()
    files["include/crlf.hpp"] = b"#pragma once\r\nint crlf();\r\n"
    raw = _raw(files)
    cfg = normalize.NormalizeConfig()
    cold = _normalize_call(FileResultCache(tmp_path, "normalize", "c", ""), raw, CountingGate(cfg))
    (part,) = _kept_parts(FileResultCache(tmp_path, "normalize", "c", ""))
    held = part.filter(pc.is_valid(part["text"]))
    assert held["path"].to_pylist() == ["include/crlf.hpp"]
    assert held["text"].to_pylist() == ["#pragma once\nint crlf();\n"]
    gate = CountingGate(cfg)
    warm = _normalize_call(FileResultCache(tmp_path, "normalize", "c", ""), raw, gate)
    assert gate.files_seen == 0
    assert warm.kept.equals(cold.kept) and warm.dropped.equals(cold.dropped)
    # a file whose bytes are not its text any more is computed again, not served
    files["include/m3.hpp"] = b"#pragma once\r\nint changed();\r\n"
    gate = CountingGate(cfg)
    again = _normalize_call(FileResultCache(tmp_path, "normalize", "c", ""), _raw(files), gate)
    assert gate.files_seen == 1
    (text,) = again.kept.filter(pc.equal(again.kept["path"], "include/m3.hpp"))["text"].to_pylist()
    assert text == "#pragma once\nint changed();\n"


def test_an_entry_that_leaves_text_to_bytes_that_are_not_utf8_is_discarded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An entry claiming a binary file's text is its bytes (as a poisoned mask would) cannot
    serve it: the bytes do not decode, the entry is discarded and its files computed again."""
    files = _corpus(4)
    raw = _raw(files)
    cfg = normalize.NormalizeConfig()
    _normalize_call(FileResultCache(tmp_path, "normalize", "c", ""), raw, CountingGate(cfg))
    # the same keys, the input's bytes swapped for bytes that are not UTF-8 in one row
    # (what a mask pointing at the wrong rows amounts to), keys kept from the first input
    bad = raw.set_column(
        raw.schema.get_field_index("content"),
        raw.schema.field("content"),
        pa.array([b"\xff\xfe" + c for c in raw["content"].to_pylist()], pa.binary()),
    )
    gate = CountingGate(cfg)
    result, hits = cached_gate_call(
        FileResultCache(tmp_path, "normalize", "c", ""),
        bad,
        row_keys(raw, "blob_sha"),
        gate,
        SCHEMAS,
        {"text": "content"},
    )
    assert hits == 0 and gate.files_seen == bad.num_rows
    assert "result cache entry discarded" in caplog.text
    assert "not its input's 'content'" in caplog.text
    assert result.kept.num_rows + result.dropped.num_rows == bad.num_rows


class NotingGate(CountingGate):
    """normalize, noting the sha256 of each kept text as a scanning gate would."""

    def __call__(self, table: pa.Table) -> GateResult:
        result = super().__call__(table)
        result.scanned_clean = text_digests(result.kept.column("text"))
        return result


def test_only_a_result_the_gate_computed_whole_carries_its_note(tmp_path: Path) -> None:
    """A gate's note of what it inspected (GateResult.scanned_clean) comes through when
    every row is the gate's own; a row served from an entry carries no note, so a result
    holding one carries none (the entry, not the gate, vouches for that row)."""
    cfg = normalize.NormalizeConfig()
    files = _corpus()
    cold = _call(FileResultCache(tmp_path, "normalize", "c", "k"), _raw(files), NotingGate(cfg))
    assert cold.scanned_clean == text_digests(cold.kept.column("text"))
    assert cold.kept.num_rows == 40

    files["include/m7.hpp"] = b"#pragma once\nint changed() { return 7; }\n"
    gate = NotingGate(cfg)
    mixed = _call(FileResultCache(tmp_path, "normalize", "c", "k"), _raw(files), gate)
    assert gate.files_seen == 1 and mixed.scanned_clean is None
    served = _call(FileResultCache(tmp_path, "normalize", "c", "k"), _raw(files), gate)
    assert gate.files_seen == 1 and served.scanned_clean is None
