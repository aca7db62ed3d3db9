"""The scrub gate's labelled evaluation set, generated at run time from a seed: real-looking
C++ files, each carrying either one injected secret (labelled with its kind and the exact
output the gate must produce) or one decoy of a false-positive class the issue lists
(labelled with its class; the gate must leave the file byte-identical).

Used by tests/test_scrub.py (targets as assertions) and bench/bench_scrub.py (the figures).
"""

from __future__ import annotations

import base64
import ipaddress
import json
import random
import string
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from megacpp_pipeline.scrub import Kind, Placeholders, ScrubConfig, scrub_text

DECOY_CLASSES: tuple[str, ...] = (
    "include_path",  # email- and IP-looking text inside #include paths
    "doxygen",  # @param / @brief / @version tags
    "operator_at",  # Objective-C @, mangled names, symbol versions, icon@2x.png
    "hex_hash",  # 0x9E3779B97F4A7C15, CRC tables, sha/md5/hmac test vectors
    "uuid",  # __declspec(uuid(...)), MIDL_INTERFACE, DEFINE_GUID
    "url",  # URLs that are not personal (git@github.com:org/repo, package@version)
    "long_identifier",  # identifiers assigned to secret-sounding names
    "private_ip",  # private, loopback, link-local, documentation, well-known DNS, netmasks
    "version_string",  # dotted quads in version contexts
    "standard_section",  # C++ standard citations: [20.10.7.6], §13.3.3.2/4
    "public_key_material",  # certificates and public keys are not secrets
    "placeholder",  # text already scrubbed stays as it is
)

FIRST = ("alice", "bob", "carol", "dmitri", "elena", "farid", "grace", "hiroshi", "ines", "jakob")
LAST = ("smith", "jarvi", "nguyen", "kowalski", "okafor", "muller", "tanaka", "rossi", "silva")
DOMAINS = (
    "corp.example",
    "gmail.com",
    "cs.utu.fi",
    "mail.example.co.uk",
    "biilabs.io",
    "kitware.com",
    "hotmail.com",
    "epfl.ch",
    "research-lab.de",
    "uni.edu",
)
PROJECTS = ("fastmath", "netcore", "imgproc", "tinyjson", "solver", "gfx-engine")
FILES = ("parser.cpp", "main.cc", "matrix.hpp", "config.h", "io.cpp", "kernel.cu.cpp")
NAMES = ("Widget", "Matrix", "Parser", "Session", "Allocator", "Renderer", "Tokenizer")

_TEMPLATES = (
    """// {project}: {name} implementation.
#include <cstdint>
#include <string>
#include <vector>

namespace {project_ns} {{

{snippet}

class {name} {{
 public:
  explicit {name}(std::size_t capacity) : data_(capacity) {{}}
  std::size_t size() const noexcept {{ return data_.size(); }}

 private:
  std::vector<std::uint8_t> data_;
}};

}}  // namespace {project_ns}
""",
    """#pragma once
/**
 * @file {file}
 * @brief Helpers for {project}.
 */
#include <map>
#include <string_view>

namespace {project_ns}::detail {{

/// @brief Returns the number of set bits.
/// @param x the word to count
inline int popcount(unsigned x) {{ return __builtin_popcount(x); }}

{snippet}

}}  // namespace {project_ns}::detail
""",
    """#include <gtest/gtest.h>

#include "{project}/{file}"

{snippet}

TEST({name}Test, RoundTrip) {{
  {project_ns}::{name} w(16);
  EXPECT_EQ(w.size(), 16u);
}}
""",
)


@dataclass(frozen=True)
class EvalItem:
    item_id: str
    label: Literal["secret", "decoy"]
    category: str  # a Kind value for secrets, a DECOY_CLASSES name for decoys
    path: str
    text: str
    expected: str  # the gate's exact output (the input itself for decoys)


@dataclass
class EvalReport:
    recall: dict[str, float]  # per kind: items whose output equals the expected output
    decoy_altered_rate: dict[str, float]  # per decoy class: items whose output changed
    counts: Counter[str] = field(default_factory=Counter)
    failures: list[tuple[str, str, str]] = field(default_factory=list)  # id, expected, got

    @property
    def min_recall(self) -> float:
        return min(self.recall.values())

    @property
    def altered_decoys(self) -> int:
        return sum(1 for item_id, _, _ in self.failures if item_id.startswith("decoy/"))


# --------------------------------------------------------------------------- generators


def _rand(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


_ALNUM = string.ascii_letters + string.digits
_B64 = _ALNUM + "+/"
_B64URL = _ALNUM + "-_"


def _person(rng: random.Random) -> tuple[str, str]:
    return rng.choice(FIRST), rng.choice(LAST)


def _email(rng: random.Random) -> str:
    first, last = _person(rng)
    local = rng.choice(
        (
            f"{first}.{last}",
            f"{first[0]}{last}",
            f"{first}_{last}",
            f"{first}+{rng.choice(('dev', 'lists', 'cpp'))}",
            f"{first}.{last}{rng.randint(1, 2024)}",
            f"{first[0]}.{first[1]}.{last}",
        )
    )
    return f"{local}@{rng.choice(DOMAINS)}"


_KEEP_IPS = frozenset(ScrubConfig().keep_ips)


def _public_ipv4(rng: random.Random) -> str:
    keep = _KEEP_IPS
    while True:
        value = ".".join(str(rng.randint(1, 254)) for _ in range(4))
        addr = ipaddress.ip_address(value)
        if addr.is_global and not addr.is_multicast and value not in keep and len(value) > 8:
            return value


def _public_ipv6(rng: random.Random) -> str:
    while True:
        first = rng.choice(("2a00", "2a02", "2a03", "2600", "2604", "2606", "2400", "2c0f"))
        groups = [first] + [f"{rng.randint(0, 0xFFFF):x}" for _ in range(rng.choice((3, 7)))]
        value = ":".join(groups) if len(groups) == 8 else ":".join(groups) + "::" + "1f"
        addr = ipaddress.ip_address(value)
        if addr.is_global and str(addr) not in _KEEP_IPS:
            return value


def _password(rng: random.Random, url_safe: bool = False) -> str:
    symbols = "-._~" if url_safe else "!#*-_.@^~+=?"
    n = rng.randint(8, 16)
    body = [rng.choice(string.ascii_lowercase), rng.choice(string.ascii_uppercase)]
    body += [rng.choice(string.digits)]
    body += [rng.choice(_ALNUM + symbols) for _ in range(n - 3)]
    rng.shuffle(body)
    return rng.choice(string.ascii_letters) + "".join(body)


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _jwt(rng: random.Random) -> str:
    header = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    first, _ = _person(rng)
    payload = _b64url(json.dumps({"sub": str(rng.randint(1, 10**9)), "name": first}).encode())
    return f"{header}.{payload}.{_b64url(rng.randbytes(32))}"


def _vendor_key(rng: random.Random) -> tuple[str, str]:
    """(secret, declaration template with {S}) for one of the token formats the gate knows."""
    r = rng.randrange(16)
    if r == 0:
        return "AKIA" + _rand(rng, string.ascii_uppercase + "234567", 16), 'auto id = "{S}";'
    if r == 1:
        return _rand(rng, _B64, 40), 'const char* aws_secret_access_key = "{S}";'
    if r == 2:
        return "ghp_" + _rand(rng, _ALNUM, 36), 'setenv("GH_AUTH", "{S}", 1);'
    if r == 3:
        return "github_pat_" + _rand(rng, _ALNUM + "_", 82), "// CI uses {S} for pushes"
    if r == 4:
        return "glpat-" + _rand(rng, _B64URL, 20), 'headers["PRIVATE-TOKEN"] = "{S}";'
    if r == 5:
        digits = f"{rng.randint(10**9, 10**12)}-{rng.randint(10**9, 10**12)}"
        return f"xoxb-{digits}-" + _rand(rng, string.ascii_lowercase + string.digits, 24), (
            'slack::Client client("{S}");'
        )
    if r == 6:
        a = _rand(rng, string.ascii_uppercase + string.digits, 9)
        b = _rand(rng, string.ascii_uppercase + string.digits, 9)
        return f"https://hooks.slack.com/services/T{a}/B{b}/" + _rand(rng, _ALNUM, 24), (
            'const std::string kWebhook = "{S}";'
        )
    if r == 7:
        return "sk_live_" + _rand(rng, _ALNUM, 24), 'stripe_init("{S}");'
    if r == 8:
        return f"sk-{_rand(rng, _ALNUM, 20)}T3BlbkFJ{_rand(rng, _ALNUM, 20)}", (
            'request.set_header("Authorization", "Bearer {S}");'
        )
    if r == 9:
        return "npm_" + _rand(rng, _ALNUM, 36), (
            'const char* kNpmrc = "//registry.npmjs.org/:_authToken={S}\\n";'
        )
    if r == 10:
        return "pypi-AgEIcHlwaS5vcmc" + _rand(rng, _B64URL, 80), "// twine upload -p {S}"
    if r == 11:
        return _jwt(rng), 'std::string bearer = "{S}";'
    if r == 12:
        return "AIza" + _rand(rng, _B64URL, 35), 'maps::Client maps{"{S}"};'
    if r == 13:
        return f"SG.{_rand(rng, _B64URL, 22)}.{_rand(rng, _B64URL, 43)}", 'mail("{S}");'
    generic = _rand(rng, _ALNUM, rng.randint(20, 40))
    decl = rng.choice(
        (
            'std::string api_key = "{S}";',
            '#define CLIENT_SECRET "{S}"',
            'static const char kApiKey[] = "{S}";',
            '{"access_token", "{S}"},',
            'auth.set_secret_key("{S}");',
        )
    )
    return generic, decl


def _pem(rng: random.Random) -> tuple[str, list[str]]:
    label = rng.choice(
        (
            "RSA PRIVATE KEY",
            "EC PRIVATE KEY",
            "OPENSSH PRIVATE KEY",
            "PRIVATE KEY",
            "ENCRYPTED PRIVATE KEY",
            "DSA PRIVATE KEY",
            "PGP PRIVATE KEY BLOCK",
        )
    )
    body = base64.b64encode(rng.randbytes(rng.choice((121, 241, 600)))).decode()
    lines = [f"-----BEGIN {label}-----"]
    lines += [body[i : i + 64] for i in range(0, len(body), 64)]
    lines.append(f"-----END {label}-----")
    return label, lines


def _ssh_key(rng: random.Random) -> str:
    first, _ = _person(rng)
    host = rng.choice(("laptop", "build-01", "ws42.corp.example", "devbox"))
    kind, prefix, n = rng.choice(
        (
            ("ssh-ed25519", "AAAAC3NzaC1lZDI1NTE5AAAAI", 43),
            ("ssh-rsa", "AAAAB3NzaC1yc2EAAAADAQABAAABAQ", 342),
            ("ecdsa-sha2-nistp256", "AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBB", 86),
        )
    )
    return f"{kind} {prefix}{_rand(rng, _B64, n)} {first}@{host}"


def _user(rng: random.Random) -> str:
    first, last = _person(rng)
    return rng.choice((first, f"{first[0]}{last}", f"{first}.{last}", f"{first}-{last}"))


def _secret_snippet(kind: Kind, rng: random.Random) -> tuple[str, str]:
    """(snippet template with {S}, secret value)."""
    first, last = _person(rng)
    name = f"{first.title()} {last.title()}"
    if kind is Kind.EMAIL:
        tpl = rng.choice(
            (
                "// Author: " + name + " <{S}>",
                " * @author " + name + " <{S}>",
                "// Copyright (c) 2019 " + name + " ({S})",
                'static const char* kMaintainer = "{S}";',
                "// Report bugs to {S}.",
                "//   mailto:{S}",
                'std::string to = "' + name + ' <{S}>";',
                " *  \\author " + name + ", {S}",
                'R"json({"maintainer": "{S}"})json"',
                "#   " + name.upper() + " <{S}>  (original port)",
            )
        )
        return tpl, _email(rng)
    if kind is Kind.IP_ADDRESS:
        tpl = rng.choice(
            (
                'const char* kServer = "{S}";',
                '  sock.connect("{S}", 443);',
                "// upstream mirror: {S}",
                'static const std::string kUrl = "http://{S}:8080/api/v1";',
                '#define TELEMETRY_HOST "{S}"',
                '{"{S}", 53},',
                '  inet_pton(AF_INET, "{S}", &addr.sin_addr);',
                "// blocked after abuse from {S}",
                'peers.emplace_back("{S}");',
            )
        )
        value = _public_ipv6(rng) if rng.random() < 0.3 else _public_ipv4(rng)
        if "http://" in tpl and ":" in value:
            value = _public_ipv4(rng)
        return tpl, value
    if kind is Kind.API_KEY:
        value, tpl = _vendor_key(rng)
        return tpl, value
    if kind is Kind.PASSWORD:
        r = rng.randrange(6)
        if r == 4:
            return f'const char* kRepo = "https://{first}:{{S}}@git.corp.example/x.git";', (
                _password(rng, url_safe=True)
            )
        if r == 5:
            return 'const char* kDsn = "postgres://app:{S}@db.internal:5432/prod";', (
                _password(rng, url_safe=True)
            )
        tpl = (
            'std::string password = "{S}";',
            rng.choice(('#define DB_PASSWORD "{S}"', 'R"yaml(\n  password: "{S}"\n)yaml"')),
            rng.choice(
                ('  db.set_password("{S}");', 'const char* kEnv = "export DB_PASSWORD={S}";')
            ),
            'const char* conn = "host=db.internal;user=app;password={S};";',
        )[r]
        value = _password(rng)
        if "conn" in tpl:
            value = value.replace(";", "")
        return tpl, value
    if kind is Kind.SSH_KEY:
        tpl = rng.choice(
            (
                "// deploy key: {S}",
                'const char* kAuthorizedKey = "{S}";',
                'keys.push_back("{S}\\n");',
            )
        )
        return tpl, _ssh_key(rng)
    if kind is Kind.LOCAL_PATH:
        user, project, file = _user(rng), rng.choice(PROJECTS), rng.choice(FILES)
        r = rng.randrange(7)
        if r == 3:
            path = f"C:\\\\Users\\\\{user}\\\\source\\\\repos\\\\{project}\\\\{file}"
            return 'static const char* kLog = "{S}";', path
        if r == 4:
            return "// see {S}", f"C:\\Users\\{user}\\Documents\\{project}\\notes.txt"
        if r == 5:
            return '"{S}",', f"/tmp/{user.split('-')[0]}-build/{project}/CMakeFiles/{file}.o"
        path = rng.choice(("/home/", "/Users/")) + f"{user}/{project}/src/{file}"
        tpl = (
            'const char* kDataDir = "{S}";',
            "// Built on {S}",
            '#line 42 "{S}"',
            "",
            "",
            "",
            '#include "{S}"',
        )[r]
        return tpl, path
    raise ValueError(f"no generator for {kind}")


def _pem_item(rng: random.Random) -> tuple[str, str, str]:
    """(text, expected, placeholder) for a private key in one of three C++ spellings."""
    ph = "{PH}"
    _, lines = _pem(rng)
    r = rng.randrange(3)
    if r == 0:
        block = "\n".join(lines)
        return f"/*\n{block}\n*/", f"/*\n{ph}\n*/", ph
    if r == 1:
        body = "\n".join(f'    "{line}\\n"' for line in lines)
        return (
            f"static const char kTestKey[] =\n{body};",
            f'static const char kTestKey[] =\n    "{ph}\\n";',
            ph,
        )
    block = "\n".join(lines)
    return (
        f'constexpr auto kPem = R"PEM(\n{block}\n)PEM";',
        f'constexpr auto kPem = R"PEM(\n{ph}\n)PEM";',
        ph,
    )


def _decoy_snippet(cls: str, rng: random.Random) -> str:
    first, last = _person(rng)
    name = rng.choice(NAMES)
    quad = _public_ipv4(rng)
    hexd = lambda n: _rand(rng, "0123456789abcdef", n)  # noqa: E731
    if cls == "include_path":
        return rng.choice(
            (
                f'#include "mirror/{quad}/net.h"',
                f"#include <vendor/lib@{rng.randint(1, 9)}.{rng.randint(0, 20)}.0/api.hpp>",
                f'#include "third_party/{first}.{last}@{rng.choice(DOMAINS)}/util.h"',
                f"#  include <proto/{first}@{rng.choice(DOMAINS)}/wire.pb.h>",
                f'#include_next "hosts/{_public_ipv6(rng)}/cfg.h"',
                f'#import "{first}@{rng.choice(DOMAINS)}/{name}.h"',
            )
        )
    if cls == "doxygen":
        return rng.choice(
            (
                "/**\n * @brief Parses a host spec of the form user@host[:port].\n"
                " * @param[in] spec the text to parse\n * @return true on success\n */",
                f"/// @version {quad}",
                f" *  @copydoc {name}::reset()\n *  @see {name}@ref",
                f"//!< @deprecated since {quad}, use @ref {name}::make",
                "/** @code obj.@property @endcode @note keep @c operator@ out */",
                f"/// \\param[out] out@{name.lower()} receives the result @sa {name}",
            )
        )
    if cls == "operator_at":
        func = rng.choice(("memcpy", "read_block", "fast_hash", "resolve"))
        return rng.choice(
            (
                f"@interface {name} : NSObject\n@property(nonatomic) int count;\n@end",
                'NSString* s = [NSString stringWithFormat:@"%@.%@", a, b];',
                f'UIImage* img = [UIImage imageNamed:@"{name.lower()}@2x.png"];',
                f'__asm__ volatile("call {func}@PLT");',
                f'__asm__(".symver {func},{func}@GLIBC_2.2.5");',
                f"// MSVC mangles it as ?{func}@@YAXH@Z and ??0{name}@ns@@QEAA@XZ",
                f'#pragma comment(linker, "/export:_{func}@12")',
                f"// npm: {name.lower()}@{rng.randint(1, 20)}.{rng.randint(0, 9)}.1",
            )
        )
    if cls == "hex_hash":
        return rng.choice(
            (
                "static constexpr std::uint64_t kGoldenRatio = 0x9E3779B97F4A7C15ULL;",
                "static const std::uint32_t kCrc32Table[256] = {\n"
                + "\n".join(
                    "    " + ", ".join(f"0x{hexd(8).upper()}" for _ in range(4)) + ","
                    for _ in range(4)
                )
                + "\n};",
                f'// sha256("abc")\nconst char* kSecretDigest = "{hexd(64)}";',
                f'static const char kHmacSecretTestVector[] = "{hexd(40)}";  // RFC 4231 hmac',
                f'const std::string secret_key_sha256 = "{hexd(64)}";',
                f'{{"api_key_hash", "{hexd(40)}"}},',
                f'EXPECT_EQ(md5_hex(password_bytes), "{hexd(32)}");',
                f'static const char* kTokenChecksum = "0x{hexd(16)}";',
            )
        )
    if cls == "uuid":
        u = str(uuid.UUID(int=rng.getrandbits(128), version=4)).upper()
        h = u.replace("-", "")
        return rng.choice(
            (
                f'struct __declspec(uuid("{u}")) I{name};',
                f'MIDL_INTERFACE("{u}")\nI{name} : public IUnknown {{}};',
                f"DEFINE_GUID(IID_I{name}, 0x{h[:8]}, 0x{h[8:12]}, 0x{h[12:16]}, 0x{h[16:18]},"
                f" 0x{h[18:20]}, 0x{h[20:22]}, 0x{h[22:24]}, 0x{h[24:26]}, 0x{h[26:28]},"
                f" 0x{h[28:30]}, 0x{h[30:32]});",
                f'static const char* kServiceKeyGuid = "{u}";',
                f'constexpr char kSecretStoreInterfaceUuid[] = "{u.lower()}";',
            )
        )
    if cls == "url":
        org, repo = rng.choice(
            (("pybind", "pybind11"), ("boostorg", "asio"), ("llvm", "llvm-project"))
        )
        return rng.choice(
            (
                f"// See https://github.com/{org}/{repo}/issues/{rng.randint(1, 9999)}",
                f'const char* kRemote = "git@github.com:{org}/{repo}.git";',
                f"// ssh://git@gitlab.com/{org}/{repo}.git",
                f"// https://cdn.jsdelivr.net/npm/{repo}@{rng.randint(1, 9)}.3.0/dist/x.min.css",
                "// Distributed under the Boost Software License, Version 1.0.\n"
                "// (See https://www.boost.org/LICENSE_1_0.txt)",
                f"// https://gcc.gnu.org/bugzilla/show_bug.cgi?id={rng.randint(10000, 99999)}",
                f"// Mirror: https://download.{org}.org/releases/{quad}/",
                f"// https://medium.com/@{first}{last}/fast-{repo}-{rng.randint(1, 99)}",
                f"// Contact: https://{org}.org/community (noreply@github.com bounces)",
            )
        )
    if cls == "long_identifier":
        return rng.choice(
            (
                "static const int ASIAPACIFICREGIONCODESTABLE_SIZE = 12;",
                'constexpr const char* kPasswordFieldName = "user_password_input_field";',
                'const char* token = "kw_reinterpret_cast";',
                'std::string secret_name = "ApplicationDefaultCredentials";',
                'auto api_key_env = "MEGACPP_SERVICE_API_KEY_V2";',
                'extern "C" void _ZN4llvm12DenseMapBaseINS_8DenseMapIPKNS_5ValueEjEEvv();',
                "#define BOOST_PP_ITERATION_PARAMS_1 (3, (0, BOOST_PP_LIMIT_ITERATION, "
                '"boost/preprocessor/iteration/detail/iter.hpp"))',
                f'{{"password", {name}::kPasswordPolicyDefault}},',
                f'const std::string secret_key_env_var = "{name.upper()}_SECRET_KEY_2";',
                "AKIAPOLICYDOCUMENT_VERSION_NUMBER_ONE = 3,",
            )
        )
    if cls == "private_ip":
        ip = rng.choice(
            (
                f"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}",
                f"192.168.{rng.randint(0, 255)}.{rng.randint(1, 254)}",
                f"172.{rng.randint(16, 31)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}",
                "127.0.0.1",
                f"169.254.{rng.randint(0, 255)}.{rng.randint(1, 254)}",
                f"100.{rng.randint(64, 127)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}",
                f"192.0.2.{rng.randint(1, 254)}",
                f"198.51.100.{rng.randint(1, 254)}",
                f"203.0.113.{rng.randint(1, 254)}",
                "8.8.8.8",
                "1.1.1.1",
                "9.9.9.9",
                "208.67.222.222",
                "255.255.255.0",
                "239.255.255.250",
                "0.0.0.0",
                "::1",
                "fe80::1",
                f"2001:db8::{rng.randint(1, 0xFFFF):x}",
                "2001:4860:4860::8888",
                "2606:4700:4700::1111",
            )
        )
        return rng.choice(
            (
                f'const char* kServer = "{ip}";',
                f'  sock.connect("{ip}", 53);',
                f"// dns server {ip}",
                f'#define DEFAULT_HOST "{ip}"',
            )
        )
    if cls == "version_string":
        up = name.upper()
        return rng.choice(
            (
                f'#define {up}_VERSION "{quad}"',
                f"// Version {quad}",
                f'static const char kVersion[] = "{quad}";',
                f" * @since {quad}",
                f'VALUE "FileVersion", "{quad}"',
                f"// release {quad} fixed an overflow in {name}::grow",
                f'constexpr auto {name.lower()}_version = "v{quad}";',
            )
        )
    if cls == "standard_section":
        return rng.choice(
            (
                f"// See [{quad}] in the standard.",
                f"// C++11 §{quad}/3: the conversion sequence is ill-formed",
                f"// per {quad}/2 [meta.rel], is_base_of is true for the class itself",
                f"// ISO/IEC 14882:2011 section {quad} says so",
                f"/* [over.ics.rank] ({quad}) */",
            )
        )
    if cls == "public_key_material":
        body = base64.b64encode(rng.randbytes(270)).decode()
        lines = [body[i : i + 64] for i in range(0, len(body), 64)]
        label = rng.choice(("CERTIFICATE", "PUBLIC KEY", "RSA PUBLIC KEY", "X509 CRL"))
        block = "\n".join([f"-----BEGIN {label}-----", *lines, f"-----END {label}-----"])
        return f'constexpr auto kRootCa = R"PEM(\n{block}\n)PEM";'
    if cls == "placeholder":
        ph = Placeholders()
        return rng.choice(
            (
                f"// Author: {first.title()} <{ph.email}>",
                f'const char* kServer = "{ph.ip_address}";',
                f'std::string password = "{ph.password}";',
                f'static const char kApiKey[] = "{ph.api_key}";',
                f'const char* kDataDir = "{ph.local_path}/data";',
            )
        )
    raise ValueError(f"no decoy generator for {cls}")


def _wrap(rng: random.Random, snippet: str) -> tuple[str, str, str]:
    """A whole file around the snippet; returns (prefix, suffix, path)."""
    project = rng.choice(PROJECTS)
    template = rng.choice(_TEMPLATES)
    file = rng.choice(FILES)
    text = template.format(
        project=project,
        project_ns=project.replace("-", "_"),
        name=rng.choice(NAMES),
        file=file,
        snippet="\0",
    )
    prefix, suffix = text.split("\0")
    return prefix, suffix, f"src/{project}/{file}"


def build_eval_set(
    seed: int = 0,
    per_kind: int = 200,
    per_decoy_class: int = 100,
    placeholders: Placeholders | None = None,
) -> list[EvalItem]:
    rng = random.Random(seed)
    ph = placeholders or Placeholders()
    items: list[EvalItem] = []
    for kind in Kind:
        for i in range(per_kind):
            if kind is Kind.PRIVATE_KEY:
                snippet, expected_snippet, mark = _pem_item(rng)
                expected_snippet = expected_snippet.replace(mark, ph.private_key)
            else:
                tpl, value = _secret_snippet(kind, rng)
                snippet = tpl.replace("{S}", value)
                expected_snippet = tpl.replace("{S}", ph.for_kind(kind))
            prefix, suffix, path = _wrap(rng, snippet)
            items.append(
                EvalItem(
                    f"secret/{kind}/{i}",
                    "secret",
                    str(kind),
                    path,
                    prefix + snippet + suffix,
                    prefix + expected_snippet + suffix,
                )
            )
    for cls in DECOY_CLASSES:
        for i in range(per_decoy_class):
            snippet = _decoy_snippet(cls, rng)
            prefix, suffix, path = _wrap(rng, snippet)
            text = prefix + snippet + suffix
            items.append(EvalItem(f"decoy/{cls}/{i}", "decoy", cls, path, text, text))
    return items


def evaluate(
    items: Sequence[EvalItem],
    config: ScrubConfig,
    scrub: Callable[[str, ScrubConfig], tuple[str, list[object]]] | None = None,
) -> EvalReport:
    fn = scrub or scrub_text
    total: Counter[str] = Counter()
    good: Counter[str] = Counter()
    failures = []
    for item in items:
        got, _ = fn(item.text, config)
        total[item.category] += 1
        if got == item.expected:
            good[item.category] += 1
        else:
            failures.append((item.item_id, item.expected, got))
    kinds = [str(k) for k in Kind]
    recall = {k: good[k] / total[k] for k in kinds if total[k]}
    altered = {c: (total[c] - good[c]) / total[c] for c in DECOY_CLASSES if total[c]}
    return EvalReport(recall, altered, total, failures)
