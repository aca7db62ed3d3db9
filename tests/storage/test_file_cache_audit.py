"""`megacpp cache verify|prune` on a real result cache: a broken entry is named and removed,
what a crashed writer left is removed once it is old, the code versions no stage runs any
more go with --config, and what is sound stays and serves the next run."""

from __future__ import annotations

import contextlib
import io
import os
import time
from pathlib import Path

import pytest

from assets import cli
from megacpp_pipeline.gates import normalize
from megacpp_pipeline.stages import default_registry
from megacpp_pipeline.storage.file_cache import FileResultCache
from tests.fixtures.catalogs import load_catalog
from tests.storage.test_file_cache import CountingGate, _call, _corpus, _raw

STAGE = "normalized_files"


def _megacpp(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


def _catalog(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.h").write_text("int a();\n")
    path = tmp_path / "sources.yaml"
    path.write_text("snapshot: t\nsources:\n  - {id: demo, kind: dir, uri: src}\n")
    return path


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    """A cache dir as `megacpp run` leaves it: entries of the current code version, one of
    them broken, a stale code version, a part without its index, temp files young and old."""
    registry = default_registry()
    catalog = load_catalog(_catalog(tmp_path), registry)
    current = registry.code_version(registry.get(STAGE), catalog)
    root = tmp_path / "cache" / "file-results"
    gate = CountingGate(normalize.NormalizeConfig())
    for source in ("demo", "other"):
        table = _raw(_corpus(4)).set_column(0, "source_id", [[source] * 5])
        _call(FileResultCache(root, STAGE, current, "", source=source), table, gate)
    _call(
        FileResultCache(root, STAGE, "an-old-code-version", "", source="demo"),
        _raw(_corpus(4)),
        gate,
    )
    other = Path(FileResultCache(root, STAGE, current, "", source="other").dir)
    kept = next(other.glob("e-*.kept.arrow"))
    kept.write_bytes(kept.read_bytes().replace(b"return 2;", b"return 5;"))
    demo = Path(FileResultCache(root, STAGE, current, "", source="demo").dir)
    old = time.time() - 2 * 3600
    for name in ("e-0123456789abcdef.kept.arrow", "e-aaaa.kept.arrow.1234.tmp"):
        (demo / name).write_bytes(b"left by a writer that died")
        os.utime(demo / name, (old, old))
    (demo / "e-bbbb.dropped.arrow.5678.tmp").write_bytes(b"a writer at work right now")
    return tmp_path / "cache"


def test_verify_names_the_broken_entry_and_fails(cache_dir: Path) -> None:
    code, out, err = _megacpp("cache", "verify", "--cache-dir", str(cache_dir))
    assert code == 1, err
    [line] = out.splitlines()
    assert f"/{STAGE}/" in line and "/other/e-" in line and "sha256" in line, line
    assert "2 entries for 10 files proved, 1 broken; 3 objects a writer left" in err, err


def test_a_file_uri_data_dir_is_local_disk_so_its_cache_is_the_cache_dirs(
    cache_dir: Path, tmp_path: Path
) -> None:
    """`megacpp run --data-dir file:///...` keeps its result cache under the cache dir (the
    store is local): verify looks there too, not in the data dir."""
    (tmp_path / "data").mkdir()
    data = (tmp_path / "data").as_uri()
    code, out, err = _megacpp("cache", "verify", "--data-dir", data, "--cache-dir", str(cache_dir))
    assert code == 1, err
    assert str(cache_dir / "file-results") in err and "1 broken" in err, err
    assert "/other/e-" in out


def test_prune_removes_what_is_broken_or_left_over_and_keeps_what_serves(
    cache_dir: Path, tmp_path: Path
) -> None:
    code, out, _ = _megacpp("cache", "prune", "--cache-dir", str(cache_dir), "--dry-run")
    assert code == 0 and len(out.splitlines()) == 3
    assert _megacpp("cache", "verify", "--cache-dir", str(cache_dir))[0] == 1  # dry: untouched
    code, out, err = _megacpp(
        "cache", "prune", "--cache-dir", str(cache_dir), "--config", str(tmp_path / "sources.yaml")
    )
    assert code == 0, err
    removed = out.splitlines()
    assert len(removed) == 4, removed  # the broken entry, the old code version, two old objects
    assert any("an-old-code-version" in line for line in removed), removed
    assert not any("5678.tmp" in line for line in removed)  # young: its writer may be at work
    code, _, err = _megacpp("cache", "verify", "--cache-dir", str(cache_dir))
    assert code == 0, err
    assert "1 entries for 5 files proved, 0 broken; 1 objects a writer left" in err, err
    registry = default_registry()
    current = registry.code_version(
        registry.get(STAGE), load_catalog(tmp_path / "sources.yaml", registry)
    )
    gate = CountingGate(normalize.NormalizeConfig())
    root = cache_dir / "file-results"
    _call(FileResultCache(root, STAGE, current, "", source="demo"), _raw(_corpus(4)), gate)
    assert gate.files_seen == 0  # what stayed still serves
