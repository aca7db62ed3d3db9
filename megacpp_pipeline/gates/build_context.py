"""The build lane of enrichment (issue 6): reads a source's `compile_commands.json` as data —
never running a command from it — into sanitized per-translation-unit build contexts
(compiler family, language standard, defines, include roots relative to the source root).

Why headers stay syntax-only
----------------------------
A compile database lists translation units, not headers. Giving a header "the union of the
contexts of the TUs that include it" would need two things we cannot honestly produce:
(1) which TUs include it — knowable only by running the preprocessor over every TU with its
flags, i.e. executing the build's logic, which this pipeline never does; and (2) a union
that means something — but TUs disagree (`-DNDEBUG` in one, not in another; `-std=c++17`
vs `c++20`; `FOO=1` vs `FOO=2`), and the union of conflicting defines is a context no
compiler ever saw. A wrong build context is worse than none, since training is meant to
treat `build` evidence as stronger than `syntax`. So only files the database names as TUs
(source extensions below) get `structure_source = build`; headers, including header entries
some tools synthesize into the database, stay `syntax`.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from megacpp_pipeline.core.errors import FieldedError

LOCAL_PATH = "<LOCAL_PATH>"

# Extensions of translation units. Header-like entries (.h, .hpp, none, ...) are ignored.
TU_EXTENSIONS = frozenset({".c", ".cc", ".cpp", ".cxx", ".c++", ".cp", ".cppm", ".ixx", ".cu"})
_WRAPPERS = frozenset({"ccache", "sccache", "distcc", "icecc", "buildcache"})
_FLAGS_GNU = ("-D", "-U", "-isystem", "-iquote", "-idirafter", "-I")
_FLAGS_MSVC = (*_FLAGS_GNU, "/D", "/U", "/external:I", "-external:I", "/I")
_DRIVE = re.compile(r"^[A-Za-z]:[\\/]")
# An absolute or home path inside a define's value: starts the value or follows a quote,
# `=`, `:`, `,` or whitespace, and has at least one path component.
_PATH_IN_VALUE = re.compile(
    r"""(?:^|(?<=[\s"'=:,(]))(?:~[\w.-]*|\$HOME|[A-Za-z]:)?[\\/][\w.+@~-]+(?:[\\/][\w.+@~-]+)*[\\/]?"""
)


class CompileDatabaseError(FieldedError, ValueError):
    """A compile database that is not a JSON compilation database; names file, entry, rule."""

    def __init__(self, origin: str, entry: int | None, rule: str) -> None:
        where = origin if entry is None else f"{origin} entry {entry}"
        super().__init__(f"{where}: {rule}")
        self.origin = origin
        self.entry = entry
        self.rule = rule


@dataclass(frozen=True)
class BuildContext:
    compiler_family: str  # gcc|clang|msvc|unknown
    language_standard: str | None  # the last -std= / /std: seen, lowercased; None if absent
    defines: tuple[str, ...]  # NAME or NAME=VALUE, in command-line order after -U
    include_roots: tuple[str, ...]  # relative to the source root, or LOCAL_PATH
    tu_path: str  # relative to the source root

    def as_record(self) -> dict[str, Any]:
        """One schemas.BUILD_CONTEXT struct value."""
        return {
            "compiler_family": self.compiler_family,
            "language_standard": self.language_standard,
            "defines": list(self.defines),
            "include_roots": list(self.include_roots),
            "tu_path": self.tu_path,
        }


@dataclass
class BuildDatabase:
    """Sanitized contexts of the TUs a compile database shares with the corpus."""

    origin: str
    contexts: dict[str, BuildContext] = field(default_factory=dict)  # corpus path -> context
    stats: Counter[str] = field(default_factory=Counter)
    # The absolute root the database was generated under; used only to relativize, never
    # written to any output.
    inferred_root: str | None = None

    def context_for(self, path: str) -> dict[str, Any] | None:
        ctx = self.contexts.get(path)
        return None if ctx is None else ctx.as_record()

    def __len__(self) -> int:
        return len(self.contexts)


def _is_abs(path: str) -> bool:
    return path.startswith(("/", "\\")) or bool(_DRIVE.match(path))


def _posix(path: str) -> str:
    """Windows paths (drive letter or backslashes) to forward slashes; POSIX ones unchanged."""
    if _DRIVE.match(path) or ("\\" in path and "/" not in path):
        return path.replace("\\", "/")
    return path


def _absolute(directory: str, path: str) -> str:
    path = _posix(path)
    joined = path if _is_abs(path) else directory.rstrip("/") + "/" + path
    return posixpath.normpath(joined)


def _relative_or_local(abs_path: str, root: str | None) -> str:
    if root is not None:
        if abs_path == root:
            return "."
        prefix = root.rstrip("/") + "/"
        if abs_path.startswith(prefix):
            return abs_path[len(prefix) :]
    return LOCAL_PATH


def _sanitize_value(value: str, directory: str, root: str | None) -> str:
    """Absolute and home paths inside a define's value become root-relative or LOCAL_PATH."""

    def replace(match: re.Match[str]) -> str:
        text = match.group(0)
        if text.startswith(("~", "$HOME")):
            return LOCAL_PATH
        return _relative_or_local(_absolute(directory, text), root)

    return _PATH_IN_VALUE.sub(replace, value)


def _msvc_style(argv: list[str]) -> bool:
    """cl.exe and clang-cl take `/D`, `/I`, `/std:` (and `/Users/...` is not a flag)."""
    family, start = _compiler_family(argv)
    name = posixpath.basename(_posix(argv[start - 1])).lower() if start else ""
    return family == "msvc" or name.removesuffix(".exe") == "clang-cl"


def _compiler_family(argv: list[str]) -> tuple[str, int]:
    """(family, index of the first real argument) after skipping ccache-style wrappers."""
    i = 0
    while i < len(argv):
        name = posixpath.basename(_posix(argv[i])).lower()
        name = name.removesuffix(".exe")
        if name in _WRAPPERS:
            i += 1
            continue
        if "clang" in name:
            return "clang", i + 1  # clang-cl too: clang's front end, MSVC-style flags
        if name == "cl":
            return "msvc", i + 1
        if re.search(r"(^|-)(g\+\+|gcc)(-[\d.]+)?$", name):
            return "gcc", i + 1
        return "unknown", i + 1  # c++, cc, icpx, nvcc: alternatives we cannot attribute
    return "unknown", len(argv)


def _split_command(command: str, origin: str, entry: int) -> list[str]:
    """shlex splitting, never a shell: `;`, `$(...)`, backticks stay inert data."""
    try:
        argv = shlex.split(command, posix=True)
        if (argv and _msvc_style(argv)) or _DRIVE.match(command.lstrip('"')):
            # cl.exe command lines use backslash paths that POSIX quoting would eat
            argv = _split_windows(command)
    except ValueError as exc:
        raise CompileDatabaseError(origin, entry, f"'command' does not split: {exc}") from exc
    return argv


def _split_windows(command: str) -> list[str]:
    """A Windows command line split as the C runtime splits it (CommandLineToArgvW): blanks
    outside quotes separate, `"` toggles quoting, 2n backslashes before a quote are n and
    the quote counts, 2n+1 are n and a literal quote, other backslashes are themselves.
    (`-DVERSION=\\"1.0\\"` is VERSION="1.0"; `-DMSG=\\"a b\\"` one argument, not two.)"""
    argv: list[str] = []
    arg: list[str] = []
    quoted = started = False
    i, n = 0, len(command)
    while i < n:
        c = command[i]
        if c == "\\":
            j = i
            while j < n and command[j] == "\\":
                j += 1
            if j < n and command[j] == '"':
                arg.append("\\" * ((j - i) // 2))
                if (j - i) % 2:
                    arg.append('"')
                else:
                    quoted = not quoted
                i, started = j + 1, True
                continue
            arg.append(command[i:j])
            i, started = j, True
            continue
        if c == '"':
            if quoted and command.startswith('"', i + 1):  # `""` inside quotes: a quote
                arg.append('"')
                i += 2
                continue
            quoted, started = not quoted, True
        elif c in " \t" and not quoted:
            if started:
                argv.append("".join(arg))
                arg, started = [], False
        else:
            arg.append(c)
            started = True
        i += 1
    if started:
        argv.append("".join(arg))
    return argv


def _flag_values(argv: list[str], start: int, msvc: bool) -> Iterator[tuple[str, str]]:
    """(flag, value) for the flags we read, in order; joined and separate forms alike."""
    flags = _FLAGS_MSVC if msvc else _FLAGS_GNU
    i = start
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":  # what follows are inputs (CMake's clang-cl rule: `-c -- <SOURCE>`)
            return
        if arg == "-o":  # an output path, never a flag (`-o /Data/x.obj` to clang-cl)
            i += 1
            continue
        for flag in flags:
            if arg == flag:
                if i < len(argv):
                    yield flag.replace("/", "-", 1).replace("-external:", "-"), argv[i]
                    i += 1
                break
            if arg.startswith(flag):
                yield flag.replace("/", "-", 1).replace("-external:", "-"), arg[len(flag) :]
                break
        else:
            if arg.startswith(("-std=", "--std=", "/std:", "-std:")):
                yield "-std", re.split(r"[=:]", arg, maxsplit=1)[1]


_MACRO_NAME = re.compile(r"[A-Za-z_]\w*")


def _context(argv: list[str], directory: str, tu_path: str, root: str | None) -> BuildContext:
    family, start = _compiler_family(argv)
    standard: str | None = None
    defines: dict[str, str | None] = {}
    roots: list[str] = []
    for flag, value in _flag_values(argv, start, _msvc_style(argv)):
        if flag in ("-D", "-U") and not _MACRO_NAME.fullmatch(value.partition("=")[0]):
            continue  # a POSIX path read as `/D...` by an MSVC-style driver, not a macro
        if flag == "-D":
            name, eq, val = value.partition("=")
            if name:
                defines.pop(name, None)  # a later -D wins and moves to the end
                defines[name] = _sanitize_value(val, directory, root) if eq else None
        elif flag == "-U":
            defines.pop(value, None)
        elif flag == "-std":
            standard = value.lower()
        elif value:
            value = _posix(value)
            if value.startswith(("~", "$", "=")):  # home, env var, sysroot-relative
                rel = LOCAL_PATH
            else:
                rel = _relative_or_local(_absolute(directory, value), root)
            if rel not in roots:
                roots.append(rel)
    return BuildContext(
        compiler_family=family,
        language_standard=standard,
        defines=tuple(k if v is None else f"{k}={v}" for k, v in defines.items()),
        include_roots=tuple(roots),
        tu_path=tu_path,
    )


def _infer_root(files: list[str], known_paths: set[str]) -> str | None:
    """The absolute directory the corpus paths hang from: each entry votes for every prefix
    whose remainder is a corpus path; most votes wins, then the shortest root."""
    votes: Counter[str] = Counter()
    for abs_file in files:
        parts = abs_file.split("/")
        for k in range(1, len(parts)):
            if "/".join(parts[k:]) in known_paths:
                votes["/".join(parts[:k]) or "/"] += 1
    if not votes:
        return None
    return min(votes, key=lambda r: (-votes[r], len(r), r))


def _entries(data: bytes, origin: str) -> list[dict[str, Any]]:
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CompileDatabaseError(origin, None, f"not JSON: {exc}") from exc
    if not isinstance(doc, list):
        raise CompileDatabaseError(origin, None, "top level must be a JSON array of entries")
    for i, entry in enumerate(doc):
        if not isinstance(entry, dict):
            raise CompileDatabaseError(origin, i, "entry must be an object")
        for key in ("directory", "file"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise CompileDatabaseError(origin, i, f"'{key}' must be a non-empty string")
        if not _is_abs(entry["directory"]):
            raise CompileDatabaseError(origin, i, "'directory' must be an absolute path")
        args = entry.get("arguments")
        if args is not None:
            if not (isinstance(args, list) and args and all(isinstance(a, str) for a in args)):
                raise CompileDatabaseError(
                    origin, i, "'arguments' must be a non-empty list of strings"
                )
        elif not isinstance(entry.get("command"), str) or not entry["command"].strip():
            raise CompileDatabaseError(origin, i, "needs 'arguments' or a non-empty 'command'")
    return doc


def parse_compile_commands(
    data: bytes, known_paths: set[str], origin: str = "compile_commands.json"
) -> BuildDatabase:
    """Sanitized build contexts for the corpus TUs (`known_paths`: POSIX paths relative to
    the source root) named by a JSON compilation database. Raises CompileDatabaseError for a
    malformed database; entries outside the corpus or naming headers are counted, not used."""
    entries = _entries(data, origin)
    directories = [_posix(e["directory"]) for e in entries]
    files = [_absolute(d, e["file"]) for d, e in zip(directories, entries, strict=True)]
    root = _infer_root(files, known_paths)
    db = BuildDatabase(origin=origin, inferred_root=root)
    db.stats["entries"] = len(entries)
    for i, (entry, directory, abs_file) in enumerate(zip(entries, directories, files, strict=True)):
        rel = _relative_or_local(abs_file, root)
        if rel not in known_paths:
            db.stats["entries_outside_corpus"] += 1
            continue
        if posixpath.splitext(rel)[1].lower() not in TU_EXTENSIONS:
            db.stats["header_entries_ignored"] += 1
            continue
        if rel in db.contexts:
            db.stats["duplicate_entries_ignored"] += 1  # first entry in database order wins
            continue
        args = entry.get("arguments")
        argv = list(args) if args is not None else _split_command(entry["command"], origin, i)
        if any(a.startswith("@") for a in argv[1:]):
            # its flags are in a response file we do not read: a context without them would
            # pass for the build's, so the file keeps the syntax evidence instead
            db.stats["response_file_entries"] += 1
            continue
        db.contexts[rel] = _context(argv, directory, rel, root)
        db.stats["translation_units"] += 1
    return db
