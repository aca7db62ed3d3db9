"""The hostile corpus, built at test time: every case is a file (or archive member, or git
entry) written next to good C++ files, with the outcome the pipeline owes it — kept, or
dropped by a named stage for a named reason. Sentinel paths stand for "this would prove
code from the corpus ran": a command, script or git hook in the corpus would create them.

`write_hostile_catalog(root)` lays out one sources.yaml around a directory source holding
most cases, for one `megacpp run` (with `full=True`, also a tar and a git source); tar, git,
zip and JSONL cases are also built alone (`write_tar`, `write_git`, `write_zip`,
`write_jsonl`) for the collect stage.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import stat
import subprocess
import sys
import tarfile
import uuid
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from tests.pipeline_corpus import _CLASS, _SOURCE, MIT, _render

KEPT = "kept"
COLLECT, NORMALIZE, LICENSE, SCRUB, ENRICH = (
    "raw_files",
    "normalized_files",
    "licensed_files",
    "scrubbed_files",
    "enriched_files",
)


@dataclass(frozen=True)
class Case:
    """One hostile input and what the ledger must say about it."""

    name: str
    source: str
    path: str  # the path as the ledger shows it
    expect: str  # KEPT or a DropReason value
    stage: str | None = None  # the stage that drops it (None when kept)
    note: str = ""


@dataclass
class HostileCorpus:
    catalog: Path
    cases: list[Case]
    good: dict[tuple[str, str], str]  # (source, path) -> text of a good file that must be kept
    secrets: dict[str, str]  # name -> a unique fake secret seeded in the corpus
    sentinel_dir: Path  # stays empty unless code from the corpus ran
    passwd_marker: str = "root:x:0:0"  # from /etc/passwd, reachable only through a symlink
    private_key_body: str = ""
    notes: dict[str, str] = field(default_factory=dict)


# --- good files -------------------------------------------------------------------------
_WORDS = [
    "alpha",
    "brisk",
    "cedar",
    "delta",
    "ember",
    "fjord",
    "grove",
    "harbor",
    "island",
    "jasper",
    "kettle",
    "lumen",
]


def good_cpp(i: int) -> str:
    """A small real-looking C++ file, distinct enough from every other i to survive near
    dedup: the class template of the pipeline corpus plus a seeded function of its own."""
    rng = random.Random(i)
    names = [f"{rng.choice(_WORDS)}_{rng.choice(_WORDS)}_{k}" for k in range(12)]
    body = "\n".join(
        f"  {n} = {rng.choice(names[:k] or ['seed'])} * {rng.randint(2, 97)} + {k};"
        for k, n in enumerate(names)
    )
    decls = ", ".join(names)
    fn = (
        f"\nnamespace extra{i} {{\n\n// Mixes {len(names)} terms into one checksum.\n"
        f"inline long mix_{i}(long seed) {{\n  long {decls};\n{body}\n"
        f"  return {' ^ '.join(names[-4:])};\n}}\n\n}}  // namespace extra{i}\n"
    )
    template = _CLASS if i % 2 else _SOURCE
    return _render(i, template, MIT, inc=f"lib{i}/container.hpp") + fn


def _write(path: Path, data: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    path.write_bytes(data)


# --- the directory source -----------------------------------------------------------------
def _fake_private_key(seed: str) -> str:
    rng = random.Random(seed)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    lines = ["".join(rng.choice(alphabet) for _ in range(64)) for _ in range(25)]
    return (
        "-----BEGIN RSA PRIVATE KEY-----\n" + "\n".join(lines) + "\n-----END RSA PRIVATE KEY-----\n"
    )


def write_dir_source(root: Path, sentinel: Path, secrets: dict[str, str]) -> list[Case]:
    """The directory source: content cases, name cases, link and special-file cases."""
    cases: list[Case] = []
    src = "hdir"

    def case(name: str, path: str, expect: str, stage: str | None, note: str = "") -> None:
        cases.append(Case(name, src, path, expect, stage, note))

    base = good_cpp(100)
    # encodings and bytes
    _write(root / "hostile/invalid_utf8.h", base.encode().replace(b"Number", b"Num\xff\xfe\xc3("))
    case("invalid_utf8", "hostile/invalid_utf8.h", KEPT, None, "decoded by the cp1252 fallback")
    _write(root / "hostile/utf16_no_bom.h", good_cpp(101).encode("utf-16-le"))
    case("utf16_without_bom", "hostile/utf16_no_bom.h", "binary", NORMALIZE, "NUL bytes")
    _write(root / "hostile/utf16_bom.h", b"\xff\xfe" + good_cpp(102).encode("utf-16-le"))
    case("utf16_with_bom", "hostile/utf16_bom.h", KEPT, None, "the BOM names the encoding")
    nul = good_cpp(103).encode()
    _write(root / "hostile/nul_bytes.h", nul[:200] + b"\x00\x00" + nul[200:])
    case("nul_bytes_in_header", "hostile/nul_bytes.h", "binary", NORMALIZE)
    _write(root / "hostile/elf.hpp", b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 16)
    case("elf_binary_named_hpp", "hostile/elf.hpp", "binary", NORMALIZE)
    _write(root / "hostile/empty.h", b"")
    case("empty_file", "hostile/empty.h", "empty", NORMALIZE)
    _write(root / "hostile/blank.hpp", " \n\t\n\n   \n")
    case("whitespace_only", "hostile/blank.hpp", "empty", NORMALIZE)
    _write(
        root / "hostile/crlf_and_cr.cc", good_cpp(104).replace("\n", "\r\n", 20).replace("\n", "\r")
    )
    case("crlf_and_lone_cr", "hostile/crlf_and_cr.cc", KEPT, None)
    # size and shape
    _write(root / "hostile/one_line_5mb.h", b"int x[] = {" + b"1," * (5 << 19) + b"};")
    case(
        "5mb_single_line", "hostile/one_line_5mb.h", "too_large", COLLECT, "collect.max_file_bytes"
    )
    _write(root / "hostile/one_line_2mb.h", b"int y[] = {" + b"2," * (1 << 20) + b"};")
    case("2mb_single_line", "hostile/one_line_2mb.h", "too_large", NORMALIZE, "1 MiB limit")
    long_line = good_cpp(105) + 'static const char* k = "' + "z" * 5000 + '";\n'
    _write(root / "hostile/long_line.h", long_line)
    case("one_5000_char_line", "hostile/long_line.h", "long_lines", NORMALIZE)
    _write(root / "hostile/minified.hpp", ("int a=1;" * 110 + "\n") * 200)
    case("minified", "hostile/minified.hpp", "mean_line_length", NORMALIZE)
    _write(
        root / "hostile/ascii_art.h", "/*" + "=-+*" * 20 + "*/\n" + ("//" + "~" * 70 + "\n") * 300
    )
    case("ascii_art", "hostile/ascii_art.h", "low_alnum", NORMALIZE)
    macro = "#define TABLE \\\n" + "  X(a1) \\\n" * 100_000 + "  X(a2)\n"
    _write(root / "hostile/macro_100k_lines.h", MIT + macro)
    case("one_macro_of_100k_lines", "hostile/macro_100k_lines.h", KEPT, None)
    deep = "W<" * 200 + "int" + ">" * 200
    _write(
        root / "hostile/deep_templates.hpp",
        good_cpp(112) + "template <class T> struct W { T v; };\n\nusing Deep = " + deep + ";\n"
        "\ninline int depth_of(const Deep&) { return 200; }\n",
    )
    case("200_deep_nested_templates", "hostile/deep_templates.hpp", KEPT, None)
    calls = "\n".join("f(" * 40 for _ in range(40)) + "1" + "\n".join(")" * 80 for _ in range(20))
    _write(root / "hostile/deep_calls.cc", good_cpp(113) + "int deep_calls = " + calls + ";\n")
    case("1600_deep_nested_calls", "hostile/deep_calls.cc", KEPT, None)
    _write(root / "hostile/macro_soup.h", MIT + "FOO BAR( BAZ ] QUX } ELSE #if\n" * 1500)
    case("macro_soup_for_tree_sitter", "hostile/macro_soup.h", "parse_error_ratio", ENRICH)
    _write(root / "hostile/unbalanced.cc", MIT + "void f() {\n" + "  if (a) { g(b[\n" * 3000)
    case("unbalanced_braces", "hostile/unbalanced.cc", "parse_error_ratio", ENRICH)
    # licences
    flood = " OR ".join(["MIT", "Apache-2.0", "BSD-3-Clause", "Zlib"] * 2500)
    _write(root / "hostile/spdx_10k_operands.h", f"// SPDX-License-Identifier: {flood}\n" + base)
    case("spdx_with_10k_operands", "hostile/spdx_10k_operands.h", "long_lines", NORMALIZE)
    many = " AND ".join(["NotARealLicense", *["MIT", "Zlib", "BSL-1.0"] * 30])
    _write(root / "hostile/spdx_unknown.h", f"// SPDX-License-Identifier: {many}\n" + good_cpp(106))
    case("spdx_90_operands_one_unknown", "hostile/spdx_unknown.h", "license_invalid", LICENSE)
    # secrets
    key = _fake_private_key(secrets["aws_key_id"])
    _write(root / "hostile/private_key.h", key)
    case(
        "pem_private_key_only",
        "hostile/private_key.h",
        "parse_error_ratio",
        ENRICH,
        "scrubbed to <PRIVATE_KEY>, then no C++ is left",
    )
    _write(
        root / "src/credentials.cc",
        good_cpp(107)
        + f'\nstatic const char* kAwsKeyId = "{secrets["aws_key_id"]}";\n'
        + f'static const char* db_password = "{secrets["password"]}";\n',
    )
    case("seeded_secrets", "src/credentials.cc", KEPT, None, "scrubbed")
    emails = ("x@y.co " * 14 + "\n") * 1500
    _write(root / "hostile/email_flood.h", MIT + "/*\n" + emails + "*/\nint after_emails;\n")
    case("21k_emails", "hostile/email_flood.h", KEPT, None, "quadratic overlap check, fixed")
    # names
    _write(root / "hostile/new\nline.h", good_cpp(108))
    case("newline_in_file_name", "hostile/new\nline.h", "unsafe_path", COLLECT)
    (root / "hostile").mkdir(exist_ok=True)
    with open(os.fsencode(root / "hostile") + b"/caf\xe9.h", "wb") as f:
        f.write(good_cpp(109).encode())
    case("non_utf8_file_name", "hostile/caf\\xe9.h", "unsafe_path", COLLECT)
    # Names cannot hold "/": these would touch files in the run's working directory.
    shell_name = "$(touch pwned_subst);`touch pwned_tick`;touch pwned_semi.h"
    _write(root / "hostile" / shell_name, good_cpp(110))
    case("shell_metacharacters_in_file_name", f"hostile/{shell_name}", KEPT, None)
    deep_dir = "/".join(["d"] * 120)
    _write(root / "hostile" / deep_dir / "deep.h", good_cpp(111))
    case("120_deep_directories", f"hostile/{deep_dir}/deep.h", KEPT, None)
    # links and special files
    os.symlink("/etc/passwd", root / "hostile/passwd.h")
    case("symlink_to_etc_passwd", "hostile/passwd.h", "symlink", COLLECT)
    os.symlink("loop_b.h", root / "hostile/loop_a.h")
    os.symlink("loop_a.h", root / "hostile/loop_b.h")
    case("symlink_loop", "hostile/loop_a.h", "symlink", COLLECT)
    os.symlink(".", root / "hostile/self")
    case("directory_symlink_loop", "hostile/self", "symlink", COLLECT)
    os.symlink("/etc", root / "hostile/etc")
    case("directory_symlink_out_of_root", "hostile/etc", "symlink", COLLECT)
    os.mkfifo(root / "hostile/pipe.h")
    case("fifo_named_h", "hostile/pipe.h", "unsafe_path", COLLECT, "opening it would block")
    # code that must never run
    script = f"#!/bin/sh\ntouch {sentinel}/configure_ran\n"
    for name in ("configure", "build.sh"):
        _write(root / name, script)
        os.chmod(root / name, 0o755)
    _write(root / "CMakeLists.txt", f'execute_process(COMMAND touch "{sentinel}/cmake_ran")\n')
    case("configure_script", "configure", "not_included", COLLECT)
    case("cmake_execute_process", "CMakeLists.txt", "not_included", COLLECT)
    commands = [
        {
            "directory": str(root),
            "command": f"c++ -std=c++17 -DX=$(touch {sentinel}/cc_subst) -c src/good_0.cc; "
            f"touch {sentinel}/cc_semicolon `touch {sentinel}/cc_backtick` && rm -rf /",
            "file": "src/good_0.cc",
        },
        {
            "directory": str(root),
            "arguments": ["sh", "-c", f"touch {sentinel}/cc_arguments", "src/good_2.cc"],
            "file": "src/good_2.cc",
        },
    ]
    _write(root / "compile_commands.json", json.dumps(commands, indent=1))
    case("compile_commands_with_shell_metacharacters", "compile_commands.json", "not_included",
         COLLECT, "metadata for the build lane, never run")  # fmt: skip
    return cases


# --- the tar source -----------------------------------------------------------------------
def write_tar(path: Path, good: dict[str, str]) -> list[Case]:
    """A tar.gz with `..` and absolute names, links out of the root, devices and fifos."""
    cases: list[Case] = []
    src = "htar"
    buf = io.BytesIO()

    def member(name: str, data: bytes = b"", **kw: object) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mtime = 1_700_000_000
        for k, v in kw.items():
            setattr(info, k, v)
        tf.addfile(info, io.BytesIO(data) if data else None)
        return info

    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.GNU_FORMAT) as tf:
        for rel, text in reversed(good.items()):  # members out of path order
            member(rel, text.encode())
        evil = good_cpp(120).encode()
        member("pkg/dup.h", good_cpp(121).encode())
        member("pkg/dup.h", evil)
        cases.append(Case("tar_duplicate_member_name", src, "pkg/dup.h", "unsafe_path", COLLECT))
        member("../escape.h", evil)
        cases.append(Case("tar_dotdot_entry", src, "../escape.h", "unsafe_path", COLLECT))
        member("/tmp/absolute_escape.h", evil)
        cases.append(Case("tar_absolute_entry", src, "/tmp/absolute_escape.h", "unsafe_path",
                          COLLECT))  # fmt: skip
        member("inc/../../sneaky.h", evil)
        cases.append(Case("tar_nested_dotdot", src, "inc/../../sneaky.h", "unsafe_path", COLLECT))
        member("inc/passwd.h", type=tarfile.SYMTYPE, linkname="/etc/passwd")
        cases.append(Case("tar_symlink_to_etc_passwd", src, "inc/passwd.h", "unsafe_path",
                          COLLECT, "link leaves the root"))  # fmt: skip
        member("inc/up.h", type=tarfile.SYMTYPE, linkname="../../../etc/shadow")
        cases.append(Case("tar_symlink_dotdot", src, "inc/up.h", "unsafe_path", COLLECT))
        member("inc/inside_link.h", type=tarfile.SYMTYPE, linkname=next(iter(good)))
        cases.append(Case("tar_symlink_inside_root", src, "inc/inside_link.h", "symlink", COLLECT))
        member("inc/hard.h", type=tarfile.LNKTYPE, linkname="/etc/shadow")
        cases.append(Case("tar_hardlink_out_of_root", src, "inc/hard.h", "unsafe_path", COLLECT))
        member("inc/null.h", type=tarfile.CHRTYPE, devmajor=1, devminor=3)
        cases.append(Case("tar_char_device", src, "inc/null.h", "unsafe_path", COLLECT))
        member("inc/fifo.h", type=tarfile.FIFOTYPE)
        cases.append(Case("tar_fifo", src, "inc/fifo.h", "unsafe_path", COLLECT))
        member("inc/new\nline.h", evil)
        cases.append(Case("tar_newline_in_name", src, "inc/new\nline.h", "unsafe_path", COLLECT))
    path.write_bytes(buf.getvalue())
    return cases


# --- the git source -----------------------------------------------------------------------
def _git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    out = subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True)
    return out.stdout.decode().strip()


def write_git(repo: Path, good: dict[str, str], sentinel: Path) -> tuple[str, list[Case]]:
    """A git repository whose own config and attributes name commands (fsmonitor, smudge
    filter, hooks) that must never run, with hostile names, a symlink and a submodule."""
    cases: list[Case] = []
    src = "hgit"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    for rel, text in good.items():
        _write(repo / rel, text)
    with open(os.fsencode(repo) + b"/bad\xff\xfename.h", "wb") as f:
        f.write(good_cpp(130).encode())
    cases.append(Case("git_non_utf8_file_name", src, "bad\\xff\\xfename.h", "unsafe_path", COLLECT))
    _write(repo / "tab\there.h", good_cpp(131))
    cases.append(Case("git_control_char_in_name", src, "tab\there.h", "unsafe_path", COLLECT))
    os.symlink("/etc/passwd", repo / "passwd.h")
    cases.append(Case("git_symlink_to_etc_passwd", src, "passwd.h", "symlink", COLLECT))
    _write(repo / ".gitattributes", "* filter=evil diff=evil\n")
    _write(repo / "filtered.h", good_cpp(132))
    cases.append(Case("git_smudge_filter_in_attributes", src, "filtered.h", KEPT, None))
    _git(repo, "add", "-A")
    _git(repo, "update-index", "--add", "--cacheinfo", f"160000,{'ab' * 20},vendor/sub")
    cases.append(Case("git_submodule", src, "vendor/sub", "not_included", COLLECT))
    _git(repo, "commit", "-q", "-m", "pinned")
    pinned = _git(repo, "rev-parse", "HEAD")
    # Config that a careless `git` call inside the repo would execute.
    for key, cmd in [
        ("core.fsmonitor", f"touch {sentinel}/git_fsmonitor"),
        ("filter.evil.smudge", f"touch {sentinel}/git_smudge; cat"),
        ("filter.evil.clean", f"touch {sentinel}/git_clean; cat"),
        ("filter.evil.process", f"touch {sentinel}/git_process"),
        ("diff.evil.textconv", f"touch {sentinel}/git_textconv; cat"),
        ("core.pager", f"touch {sentinel}/git_pager; cat"),
        ("core.sshCommand", f"touch {sentinel}/git_ssh"),
    ]:
        _git(repo, "config", key, cmd)
    hooks = repo / ".git/hooks"
    for hook in ("post-checkout", "pre-commit", "post-merge", "reference-transaction"):
        _write(hooks / hook, f"#!/bin/sh\ntouch {sentinel}/git_hook_{hook}\n")
        os.chmod(hooks / hook, 0o755)
    return pinned, cases


# --- zip and jsonl (collect stage alone) ----------------------------------------------------
def write_zip(path: Path, good: dict[str, str]) -> list[Case]:
    """A zip with a compression bomb, a member whose header lies about its size, escaping
    names, a symlink, and more members than collect.max_files allows (set it to 40)."""
    cases: list[Case] = []
    src = "hzip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for rel, text in good.items():
            zf.writestr(rel, text)
        zf.writestr("bomb.h", b"\0" * (64 << 20))
        cases.append(Case("zip_bomb", src, "bomb.h", "archive_limit", COLLECT, "ratio ~1000"))
        zf.writestr("liar.h", b"int liar;\n" * (1 << 19))
        cases.append(Case("zip_member_header_lies_about_size", src, "liar.h", "unreadable",
                          COLLECT))  # fmt: skip
        zf.writestr("../zip_escape.h", good_cpp(140))
        cases.append(Case("zip_dotdot_entry", src, "../zip_escape.h", "unsafe_path", COLLECT))
        zf.writestr("/abs_zip.h", good_cpp(141))
        cases.append(Case("zip_absolute_entry", src, "/abs_zip.h", "unsafe_path", COLLECT))
        link = zipfile.ZipInfo("link.h")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(link, "/etc/passwd")
        cases.append(Case("zip_symlink", src, "link.h", "symlink", COLLECT))
        for k in range(60):
            zf.writestr(f"many/f{k:03d}.h", f"int many_{k};\n")
        cases.append(Case("zip_too_many_members", src, "many/f059.h", "archive_limit", COLLECT))
    _shrink_declared_size(path, b"liar.h", 1000)
    return cases


def _shrink_declared_size(path: Path, name: bytes, size: int) -> None:
    """Rewrite a member's uncompressed size in both its local and central headers."""
    data = bytearray(path.read_bytes())
    for sig, name_len_at, size_at, header in (
        (b"PK\x03\x04", 26, 22, 30),
        (b"PK\x01\x02", 28, 24, 46),
    ):
        pos = data.find(sig)
        while pos >= 0:
            n = int.from_bytes(data[pos + name_len_at : pos + name_len_at + 2], "little")
            if bytes(data[pos + header : pos + header + n]) == name:
                data[pos + size_at : pos + size_at + 4] = size.to_bytes(4, "little")
            pos = data.find(sig, pos + 4)
    path.write_bytes(bytes(data))


def write_jsonl(path: Path, good: dict[str, str]) -> list[Case]:
    cases: list[Case] = []
    src = "hjsonl"
    lines = [json.dumps({"path": rel, "content": text}) for rel, text in good.items()]
    lines.append(json.dumps({"path": "../../etc/passwd.h", "content": "x"}))
    cases.append(Case("jsonl_dotdot_path", src, "../../etc/passwd.h", "unsafe_path", COLLECT))
    lines.append(json.dumps({"path": "/etc/abs.h", "content": "x"}))
    cases.append(Case("jsonl_absolute_path", src, "/etc/abs.h", "unsafe_path", COLLECT))
    lines.append('{"path": "broken.h", "content": ')
    where = f"<line {len(lines)}>"
    cases.append(Case("jsonl_truncated_record", src, where, "malformed_record", COLLECT))
    path.write_text("\n".join(lines) + "\n")
    return cases


# --- the catalog --------------------------------------------------------------------------
def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


MORE_SOURCES = """\
  - id: htar
    kind: archive
    uri: archive.tar.gz
    sha256: {tar_sha}
    declared_license: MIT
  - id: hgit
    kind: git
    uri: corpus_git
    revision: {pinned}
    declared_license: MIT
"""


def write_hostile_catalog(root: Path, full: bool = False) -> HostileCorpus:
    """A directory source (and when `full`, a tar and a git source) with good files and the
    hostile cases beside them. The default suite runs the tar and git cases through collect
    alone (every archive read and git command of the pipeline is in that stage) and keeps
    its one CLI run to the directory source; the slow suite runs all three."""
    sentinel = root / "outside" / "sentinels"
    sentinel.mkdir(parents=True)
    tag = uuid.uuid4().hex[:16].upper()
    secrets = {
        "aws_key_id": "AKIA" + "".join(c for c in tag if c.isalnum())[:16].ljust(16, "Q"),
        "password": f"Hx7!{uuid.uuid4().hex[:14]}-pw",
    }
    good: dict[tuple[str, str], str] = {}
    dir_root = root / "corpus_dir"
    for k in range(6):
        for rel in (f"src/good_{k}.cc", f"include/good_{k}.hpp"):
            text = good_cpp(len(good))
            _write(dir_root / rel, text)
            good[("hdir", rel)] = text
    cases = write_dir_source(dir_root, sentinel, secrets)
    more_sources = ""
    if full:
        tar_good = {f"pkg/good_{k}.h": good_cpp(200 + k) for k in range(4)}
        good.update({("htar", rel): text for rel, text in tar_good.items()})
        tar_path = root / "archive.tar.gz"
        cases += write_tar(tar_path, tar_good)
        git_good = {f"lib/good_{k}.hpp": good_cpp(300 + k) for k in range(4)}
        good.update({("hgit", rel): text for rel, text in git_good.items()})
        pinned, git_cases = write_git(root / "corpus_git", git_good, sentinel)
        cases += git_cases
        more_sources = MORE_SOURCES.format(pinned=pinned, tar_sha=sha256_of(tar_path))
    catalog = root / "sources.yaml"
    catalog.write_text(
        f"""\
snapshot: hostile
seq_len: 256
collect:
  max_file_bytes: 4194304
sources:
  - id: hdir
    kind: dir
    uri: corpus_dir
    declared_license: MIT
    compile_commands: compile_commands.json
{more_sources}stages:
  tokenizer:
    vocab_size: 600
    min_frequency: 2
  tokenize:
    validation_fraction: 0.2
  snapshot:
    smoke_batches: 1
    smoke_batch_size: 2
"""
    )
    return HostileCorpus(
        catalog=catalog,
        cases=cases,
        good=good,
        secrets=secrets,
        sentinel_dir=sentinel,
        private_key_body=_fake_private_key(secrets["aws_key_id"]).splitlines()[3],
    )


# --- one CLI run over the corpus, shared by the hostile and security tests ------------------
REPO = Path(__file__).resolve().parent.parent.parent
RUN_TIMEOUT = 900  # seconds: a hang fails the test instead of blocking the suite


@dataclass
class HostileRun:
    root: Path
    corpus: HostileCorpus
    out: subprocess.CompletedProcess
    env: dict[str, str]
    data: Path
    home: Path
    cache: Path
    tmp: Path
    cwd: Path
    tree_before: dict[str, tuple[int, int, int]]

    @property
    def snapshot(self) -> Path:
        return Path(self.out.stdout.strip().splitlines()[-1])


OWNED_BY_THE_RUN = ("data", "dagster_home", "cache", "tmp")


def tree_listing(root: Path) -> dict[str, tuple[int, int, int]]:
    """(mode, size, mtime) of everything under root except what the run may write; never
    opens a file (a fifo would block) and never follows a link."""
    out: dict[str, tuple[int, int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d not in OWNED_BY_THE_RUN]
        for name in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, name))
            key = os.path.normpath(os.path.join(rel_dir, name))
            out[key] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


_RUNS: dict[str, HostileRun] = {}


def hostile_run(root: Path, full: bool = False) -> HostileRun:
    """`megacpp run` over the hostile catalog, once per test session (memoized)."""
    key = f"run:{full}"
    if key in _RUNS:
        return _RUNS[key]
    corpus = write_hostile_catalog(root, full)
    tmp, cwd = root / "tmp", root / "outside" / "cwd"
    tmp.mkdir()
    cwd.mkdir(parents=True)
    env = {
        **os.environ,
        "DAGSTER_HOME": str(root / "dagster_home"),
        "MEGACPP_CACHE_DIR": str(root / "cache"),
        "TMPDIR": str(tmp),
        "PYTHONPATH": str(REPO),
    }
    before = tree_listing(root)
    out = subprocess.run(
        [sys.executable, "-m", "megacpp_pipeline.cli", "run", "--config", str(corpus.catalog),
         "--data-dir", str(root / "data")],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT,
    )  # fmt: skip
    run = HostileRun(
        root, corpus, out, env, root / "data", root / "dagster_home", root / "cache", tmp, cwd,
        before,
    )  # fmt: skip
    _RUNS[key] = run
    return run
