"""REUSE metadata (REUSE.toml, .reuse/dep5, `<file>.license` sidecars): which files it
speaks for and what it says of them. FSFE's reuse package applies REUSE's precedence rules;
this module only hands it the files.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

# What REUSE metadata can say a licence rests on: the file's own header tags, or REUSE.
ReuseSource = Literal["file", "reuse"]


def is_reuse_metadata_path(path: str) -> bool:
    """Files the collector must hand to this gate: REUSE.toml anywhere, the root
    .reuse/dep5, and `<file>.license` sidecars."""
    if path.startswith("/"):  # not a file of the source (a JSONL record's licence)
        return False
    name = PurePosixPath(path).name
    return (
        name == "REUSE.toml"
        or path == ".reuse/dep5"
        or (name.endswith(".license") and name != ".license")
    )


class ReuseMetadataError(ValueError):
    """REUSE.toml / .reuse/dep5 of a source cannot be read; names the file and the cause."""


@dataclass(frozen=True)
class ReuseFinding:
    expressions: tuple[str, ...]
    source: ReuseSource  # "file" when only the file's own tags were found
    detail: str


def reuse_findings(
    paths: list[str], file_tags: list[list[str]], reuse_files: Mapping[str, bytes]
) -> list[ReuseFinding | None]:
    """Resolve every file through reuse's Project so that REUSE's precedence rules
    (sidecar replaces the file's own tags; REUSE.toml closest / aggregate / override;
    dep5 aggregates) are the library's, not ours. The project is a scratch directory
    holding the metadata files and, for each C/C++ file, a stub carrying only the tags we
    accepted from its leading comment."""
    from reuse.project import Project

    with tempfile.TemporaryDirectory(prefix="megacpp-reuse-") as scratch:
        root = Path(scratch)
        for rel, content in reuse_files.items():
            target = _inside(root, rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        for rel, tags in zip(paths, file_tags, strict=True):
            target = _inside(root, rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("".join(f"SPDX-License-Identifier: {tag}\n" for tag in tags))
        try:
            # subprojects/<name>/ too: reuse skips it as a Meson subproject unless asked, and
            # its REUSE.toml speaks for files that are in the corpus all the same
            project = Project.from_directory(root, include_meson_subprojects=True)
        except Exception as error:  # reuse raises what its parser trips on (a typo'd table)
            where = getattr(error, "source", None) or _unreadable_toml(reuse_files)
            # name files as the source does, never by the scratch dir (the ledger must be
            # the same on every run)
            message = f"{where}: {error}".replace(f"{root}/", "").replace(str(root), ".")
            raise ReuseMetadataError(message) from error
        findings: list[ReuseFinding | None] = []
        for rel in paths:
            infos = project.reuse_info_of(root / rel)
            expressions: list[str] = []
            origins: list[str] = []
            only_header = True
            for info in infos:
                if not info.spdx_expressions:
                    continue
                expressions.extend(sorted(str(expr) for expr in info.spdx_expressions))
                kind = info.source_type.value if info.source_type else "unknown"
                only_header &= kind == "file-header"
                origins.append(f"{info.source_path} ({kind})")
            if not expressions:
                findings.append(None)
                continue
            source: ReuseSource = "file" if only_header else "reuse"
            findings.append(ReuseFinding(tuple(expressions), source, "; ".join(origins)))
        return findings


def _unreadable_toml(reuse_files: Mapping[str, bytes]) -> str:
    """The first REUSE.toml reuse cannot read, to name in an error that does not say which."""
    from reuse.global_licensing import ReuseTOML

    for rel, content in sorted(reuse_files.items()):
        if PurePosixPath(rel).name == "REUSE.toml":
            try:
                ReuseTOML.from_toml(content.decode("utf-8"), rel)
            except Exception:  # as in covered_by_reuse: whatever a malformed table trips
                return rel
    return "REUSE metadata"


def covered_by_reuse(paths: list[str], reuse_files: Mapping[str, bytes]) -> list[bool]:
    """Which files REUSE metadata can speak for: a sidecar, dep5 (covers everything), or an
    annotation of some REUSE.toml matching (reuse's own glob matcher decides). The rest
    skip the scratch project, which costs about 2 ms a file."""
    from reuse.global_licensing import ReuseTOML

    if ".reuse/dep5" in reuse_files:
        return [True] * len(paths)
    sidecars = {rel.removesuffix(".license") for rel in reuse_files if rel.endswith(".license")}
    tomls: list[tuple[str, ReuseTOML]] = []
    for rel, content in reuse_files.items():
        if PurePosixPath(rel).name != "REUSE.toml":
            continue
        try:
            toml = ReuseTOML.from_toml(content.decode("utf-8"), rel)
        except Exception:  # ReuseError, bad UTF-8, or what a malformed table trips in reuse
            return [True] * len(paths)  # the project load reports the error for every file
        directory = PurePosixPath(rel).parent.as_posix()
        tomls.append(("" if directory == "." else directory + "/", toml))
    return [
        path in sidecars
        or any(
            path.startswith(prefix) and toml.find_annotations_item(path[len(prefix) :]) is not None
            for prefix, toml in tomls
        )
        for path in paths
    ]


def _inside(root: Path, rel: str) -> Path:
    pure = PurePosixPath(rel)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts:
        raise ReuseMetadataError(f"{rel!r}: path escapes the source root")
    return root.joinpath(*pure.parts)
