"""sources.yaml: a wrong, missing or unknown field fails before any work, naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from megacpp_pipeline.core.catalog import CatalogError
from tests.fixtures.catalogs import load_catalog

GOOD = """
snapshot: demo
seq_len: 2048
sources:
  - id: pybind11
    kind: archive
    uri: wheels/pybind11.whl
    sha256: {sha}
    declared_license: BSD-3-Clause
  - id: fmt
    kind: git
    uri: https://example.invalid/fmt.git
    revision: {rev}
    role: catalog
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sources.yaml"
    path.write_text(text)
    return path


def test_a_good_catalog_resolves_relative_uris_against_its_folder(tmp_path: Path) -> None:
    cat = load_catalog(_write(tmp_path, GOOD.format(sha="a" * 64, rev="b" * 40)))
    assert [s.id for s in cat.operational] == ["pybind11"]
    assert cat.resolve_uri(cat.sources[0]) == str(tmp_path / "wheels" / "pybind11.whl")
    assert cat.resolve_uri(cat.sources[1]).startswith("https://")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (GOOD.format(sha="a" * 63, rev="b" * 40), "source 'pybind11': field sha256"),
        (GOOD.format(sha="a" * 64, rev="main"), "source 'fmt': field revision: .*exact"),
        (
            GOOD.format(sha="a" * 64, rev="b" * 40).replace("declared_license", "declared_licence"),
            "source 'pybind11': field declared_licence: unknown key",
        ),
        (
            GOOD.format(sha="a" * 64, rev="b" * 40).replace("id: fmt", "id: pybind11"),
            "duplicate source id 'pybind11'",
        ),
        (
            GOOD.format(sha="a" * 64, rev="b" * 40).replace("kind: archive", "kind: tarball"),
            "source 'pybind11': field kind",
        ),
        (
            GOOD.format(sha="a" * 64, rev="b" * 40).replace("id: fmt", "id: Fmt!"),
            "field id",
        ),
        ("snapshot: demo\nseq_len: 2048\nsources: []\n", "field sources"),
        ("snapshot: demo\nseqlen: 2048\nsources: []\n", "field seqlen: unknown key"),
    ],
)
def test_bad_catalogs_name_the_source_and_the_field(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(CatalogError, match=message):
        load_catalog(_write(tmp_path, text))


def test_archive_without_sha256_is_refused(tmp_path: Path) -> None:
    text = "snapshot: d\nsources:\n  - id: a\n    kind: archive\n    uri: a.zip\n"
    with pytest.raises(CatalogError, match="source 'a'.*archive sources need sha256"):
        load_catalog(_write(tmp_path, text))


def test_operational_git_source_needs_an_exact_commit(tmp_path: Path) -> None:
    text = "snapshot: d\nsources:\n  - id: a\n    kind: git\n    uri: x\n"
    with pytest.raises(CatalogError, match="need revision"):
        load_catalog(_write(tmp_path, text))


def test_subdir_may_not_leave_the_source(tmp_path: Path) -> None:
    text = "snapshot: d\nsources:\n  - id: a\n    kind: dir\n    uri: x\n    subdir: ../etc\n"
    with pytest.raises(CatalogError, match="field subdir"):
        load_catalog(_write(tmp_path, text))


def test_missing_file_and_bad_yaml_are_clear(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="no such file"):
        load_catalog(tmp_path / "nope.yaml")
    with pytest.raises(CatalogError, match="not valid YAML"):
        load_catalog(_write(tmp_path, "sources: [\n"))


def test_the_demo_catalog_is_valid() -> None:
    cat = load_catalog(Path(__file__).resolve().parents[2] / "examples/demo/sources.yaml")
    assert {s.id for s in cat.operational} == {"pythran", "pybind11", "nanobind"}


DIR_SOURCE = """
snapshot: demo
{top}sources:
  - id: tree
    kind: dir
    uri: src
{field}
"""


@pytest.mark.parametrize(
    "field",
    [
        '    include: ["../*.h"]',
        '    exclude: ["**/x.h", "a/../../b.h"]',
        '    include: ["/etc/*"]',
    ],
    ids=["include-dotdot", "exclude-dotdot", "include-absolute"],
)
def test_a_pattern_that_reaches_outside_the_source_is_refused_at_load(
    tmp_path: Path, field: str
) -> None:
    with pytest.raises(CatalogError) as caught:
        load_catalog(_write(tmp_path, DIR_SOURCE.format(top="", field=field)))
    message = str(caught.value)
    name = field.split(":")[0].strip()
    assert f"source 'tree': field {name}: " in message and "outside the source" in message


def test_one_size_policy_for_every_stage_with_a_per_source_override(tmp_path: Path) -> None:
    cat = load_catalog(_write(tmp_path, DIR_SOURCE.format(top="max_file_bytes: 4096\n", field="")))
    assert cat.file_limit(cat.sources[0]) == 4096
    own = load_catalog(
        _write(
            tmp_path,
            DIR_SOURCE.format(top="max_file_bytes: 4096\n", field="    max_file_bytes: 65536"),
        )
    )
    assert own.file_limit(own.sources[0]) == 65536
    assert load_catalog(_write(tmp_path, DIR_SOURCE.format(top="", field=""))).file_limit(
        cat.sources[0].model_copy(update={"max_file_bytes": None})
    ) == (1 << 20)


@pytest.mark.parametrize(
    "section",
    [
        "collect: {max_file_bytes: 1000}\n",
        "stages: {normalize: {max_file_bytes: 1000}}\n",
        "stages: {enrich: {max_file_bytes: 1000}}\n",
    ],
    ids=["collect", "normalize", "enrich"],
)
def test_the_old_per_stage_size_limits_say_where_the_one_setting_is(
    tmp_path: Path, section: str
) -> None:
    with pytest.raises(CatalogError) as caught:
        load_catalog(_write(tmp_path, DIR_SOURCE.format(top=section, field="")))
    message = str(caught.value)
    assert "max_file_bytes: there is one size policy now" in message, message
    assert "(the entry itself)" not in message


@pytest.mark.parametrize(
    ("section", "moved"),
    [
        ("stages: {tokenize: {validation_fraction: 0.2}}\n", "split.validation_fraction"),
        ("stages: {tokenize: {split_salt: other}}\n", "split.salt"),
    ],
    ids=["fraction", "salt"],
)
def test_the_split_has_its_own_section_and_the_old_place_says_so(
    tmp_path: Path, section: str, moved: str
) -> None:
    with pytest.raises(CatalogError) as caught:
        load_catalog(_write(tmp_path, DIR_SOURCE.format(top=section, field="")))
    assert f"has its own section now: set {moved}" in str(caught.value)
    top = "split: {validation_fraction: 0.2, salt: other}\n"
    cat = load_catalog(_write(tmp_path, DIR_SOURCE.format(top=top, field="")))
    assert (cat.split.validation_fraction, cat.split.salt) == (0.2, "other")


def test_a_shards_section_is_refused_naming_it_not_accepted_and_ignored(tmp_path: Path) -> None:
    section = "shards: {max_rows: 1, max_bytes: 100}\n"
    with pytest.raises(CatalogError) as caught:
        load_catalog(_write(tmp_path, DIR_SOURCE.format(top=section, field="")))
    message = str(caught.value)
    assert "shards: not a setting of sources.yaml" in message, message
    assert "max_bytes_per_shard" in message and "(the entry itself)" not in message


def test_a_refresh_time_zone_that_does_not_exist_is_refused_naming_the_field(
    tmp_path: Path,
) -> None:
    section = "refresh: {timezone: Europe/Atlantis}\n"
    with pytest.raises(CatalogError, match="field refresh.timezone: unknown time zone"):
        load_catalog(_write(tmp_path, DIR_SOURCE.format(top=section, field="")))
    section = "refresh: {timezone: Europe/Berlin}\n"
    cat = load_catalog(_write(tmp_path, DIR_SOURCE.format(top=section, field="")))
    assert cat.refresh.timezone == "Europe/Berlin"
