"""The scrub gate, specified: what each detector replaces, what each false-positive class
keeps, and the contracts of run() (schema, audit, residual check)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from megacpp_pipeline.core import schemas
from megacpp_pipeline.gates.scrub import (
    AUDIT_SCHEMA,
    Kind,
    Placeholders,
    ScrubConfig,
    markdown_sample,
    residual_findings,
    residual_table,
    run,
    scrub_text,
)
from tests.fixtures.scrub_eval import DECOY_CLASSES, FAMILIES, build_eval_set, evaluate
from tests.fixtures.scrub_heldout import build_heldout_set

CONFIG = ScrubConfig()


def scrubbed(text: str, config: ScrubConfig = CONFIG) -> str:
    return scrub_text(text, config)[0]


def licensed_table(files: dict[str, str], source_id: str = "demo") -> pa.Table:
    paths = list(files)
    texts = [files[p] for p in paths]
    n = len(paths)
    return pa.table(
        {
            "source_id": [source_id] * n,
            "path": paths,
            "revision": ["0" * 40] * n,
            "blob_sha": [schemas.git_blob_sha(t.encode()) for t in texts],
            "size": [len(t.encode()) for t in texts],
            "encoding": ["utf-8"] * n,
            "text": texts,
            "content_sha256": [schemas.text_sha256(t) for t in texts],
            "language": ["c++"] * n,
            "vendored": [False] * n,
            "license_expression": ["MIT"] * n,
            "license_source": ["file"] * n,
            "license_decision": ["allowed"] * n,
            "license_detail": [None] * n,
        },
        schema=schemas.LICENSED_FILES,
    )


# --------------------------------------------------------------------------- emails


def test_author_email_in_angle_brackets_is_replaced_and_the_name_kept() -> None:
    text = "// Copyright (c) 2016 Wenzel Jakob <wenzel.jakob@epfl.ch>\n"
    assert scrubbed(text) == "// Copyright (c) 2016 Wenzel Jakob <<EMAIL>>\n"


def test_email_in_parentheses_string_and_mailto_is_replaced() -> None:
    text = (
        "// (C) Copyright 2002 Rani Sharoni (rani_sharoni@hotmail.com) and\n"
        'static const char* kTo = "jaakko.jarvi@cs.utu.fi";\n'
        "// mailto:ichesnokov@gmail.com\n"
    )
    assert scrubbed(text) == (
        "// (C) Copyright 2002 Rani Sharoni (<EMAIL>) and\n"
        'static const char* kTo = "<EMAIL>";\n'
        "// mailto:<EMAIL>\n"
    )


def test_sentence_full_stop_after_an_email_stays() -> None:
    assert scrubbed("// Report bugs to dev+lists@corp.example.\n") == "// Report bugs to <EMAIL>.\n"


# --------------------------------------------------------------------------- IP addresses


def test_public_ipv4_is_replaced_and_its_port_kept() -> None:
    text = 'const char* kUrl = "http://93.184.216.34:8080/api";  // server\n'
    assert scrubbed(text) == 'const char* kUrl = "http://<IP_ADDRESS>:8080/api";  // server\n'


def test_public_ipv6_is_replaced() -> None:
    assert scrubbed('sock.connect("2a00:1450:4001:81d::200e");') == 'sock.connect("<IP_ADDRESS>");'


@pytest.mark.parametrize(
    "address",
    [
        "10.1.2.3",
        "192.168.0.10",
        "172.20.1.1",
        "127.0.0.1",
        "169.254.1.1",
        "100.64.0.1",
        "192.0.2.15",
        "198.51.100.7",
        "203.0.113.200",
        "8.8.8.8",
        "1.1.1.1",
        "255.255.255.0",
        "239.255.255.250",
        "::1",
        "fe80::1",
        "2001:db8::42",
        "2001:4860:4860::8888",
    ],
)
def test_private_loopback_documentation_multicast_and_dns_addresses_are_kept(
    address: str,
) -> None:
    text = f'const char* kServer = "{address}";  // dns server\n'
    assert scrubbed(text) == text


@pytest.mark.parametrize(
    "line",
    [
        '#define ZLIB_VERSION "23.41.117.9"',
        "// Version 145.20.30.40 fixed the overflow",
        'VALUE "FileVersion", "61.17.201.77"',
        " * @since 93.184.216.34",
        'static const char kBuild[] = "v93.184.216.34";',
    ],
)
def test_dotted_quad_in_a_version_context_is_kept(line: str) -> None:
    assert scrubbed(line) == line


def test_small_number_quad_without_network_words_is_a_version_as_bigcode_decides() -> None:
    # the price of keeping `// 18.11.2.7 comparison operators` (libc++ section numbers):
    # a public address whose numbers are all below 100 needs a network word nearby
    assert scrubbed("parse(5.6.7.8)") == "parse(5.6.7.8)"
    assert scrubbed("// 18.11.2.7 comparison operators") == "// 18.11.2.7 comparison operators"
    assert scrubbed("{17.23.96.54, 53},") == "{17.23.96.54, 53},"
    assert scrubbed('{"17.23.96.54", 53},') == '{"<IP_ADDRESS>", 53},'  # a string of its own
    assert scrubbed('connect_to_server("5.6.7.8")') == 'connect_to_server("<IP_ADDRESS>")'
    assert scrubbed('kPeers = {"17.23.96.54"};') == 'kPeers = {"<IP_ADDRESS>"};'
    assert scrubbed('"http://17.23.96.54/x"') == '"http://<IP_ADDRESS>/x"'


# --------------------------------------------------------------------------- keys and tokens


def _tok(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
_R = random.Random(7)
VENDOR_TOKENS = {
    "aws_access_key_id": "AKIA" + _tok(_R, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 16),
    "github_token": "ghp_" + _tok(_R, ALNUM, 36),
    "github_fine_grained": "github_pat_" + _tok(_R, ALNUM + "_", 82),
    "gitlab_token": "glpat-" + _tok(_R, ALNUM + "-_", 20),
    "slack_token": "xoxb-123456789012-1234567890123-" + _tok(_R, "abcdefghij0123456789", 24),
    "stripe_key": "sk_live_" + _tok(_R, ALNUM, 24),
    "openai_key": "sk-" + _tok(_R, ALNUM, 20) + "T3BlbkFJ" + _tok(_R, ALNUM, 20),
    "npm_token": "npm_" + _tok(_R, ALNUM, 36),
    "pypi_token": "pypi-AgEIcHlwaS5vcmc" + _tok(_R, ALNUM + "-_", 80),
    "google_api_key": "AIza" + _tok(_R, ALNUM + "-_", 35),
    "sendgrid_key": "SG." + _tok(_R, ALNUM, 22) + "." + _tok(_R, ALNUM, 43),
    "jwt": "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
    + _tok(_R, ALNUM + "-_", 43),
}


@pytest.mark.parametrize("vendor", sorted(VENDOR_TOKENS))
def test_vendor_token_in_a_string_literal_is_replaced(vendor: str) -> None:
    token = VENDOR_TOKENS[vendor]
    text = f'client.set_credentials("{token}");\n'
    out, findings = scrub_text(text, CONFIG)
    assert out == 'client.set_credentials("<API_KEY>");\n'
    assert [f.kind for f in findings] == [Kind.API_KEY]


def test_aws_secret_access_key_assigned_to_its_name_is_replaced() -> None:
    secret = _tok(random.Random(3), ALNUM + "/+", 40)
    text = f'const char* aws_secret_access_key = "{secret}";'
    assert scrubbed(text) == 'const char* aws_secret_access_key = "<API_KEY>";'


def test_npmrc_token_inside_a_cpp_string_keeps_the_string_intact() -> None:
    token = VENDOR_TOKENS["npm_token"]
    text = f'const char* kNpmrc = "//registry.npmjs.org/:_authToken={token}\\n";'
    assert scrubbed(text) == 'const char* kNpmrc = "//registry.npmjs.org/:_authToken=<API_KEY>\\n";'


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('std::string api_key = "Zq8vLr2Xw9Tn4Kp7Hs3D";', 'std::string api_key = "<API_KEY>";'),
        ('#define CLIENT_SECRET "Zq8vLr2Xw9Tn4Kp7Hs3D"', '#define CLIENT_SECRET "<API_KEY>"'),
        ('{"access_token", "Zq8vLr2Xw9Tn4Kp7Hs3D"},', '{"access_token", "<API_KEY>"},'),
        ('std::string password = "hunter2!x";', 'std::string password = "<PASSWORD>";'),
        ('db.set_password("Tr0ub4dor&3");', 'db.set_password("<PASSWORD>");'),
        (
            '"host=db;user=app;password=S3cr3tPw;"',
            '"host=db;user=app;password=<PASSWORD>;"',
        ),
        ('"export DB_PASSWORD=S3cr3tPw"', '"export DB_PASSWORD=<PASSWORD>"'),
    ],
)
def test_secret_assigned_to_a_secret_sounding_name_is_replaced(line: str, expected: str) -> None:
    assert scrubbed(line) == expected


def test_password_in_url_userinfo_is_replaced_and_user_and_host_kept() -> None:
    text = 'const char* kDsn = "postgres://app:Xk29sLq0@db.internal:5432/prod";'
    assert scrubbed(text) == 'const char* kDsn = "postgres://app:<PASSWORD>@db.internal:5432/prod";'


@pytest.mark.parametrize(
    "line",
    [
        "std::string password = read_password();",
        'const char* prompt = "Enter password: ";',
        'constexpr const char* kPasswordFieldName = "user_password_input_field";',
        'auto api_key_env = "MEGACPP_SERVICE_API_KEY_V2";',
        'std::string secret_name = "ApplicationDefaultCredentials";',
        'const char* token_format = "%s-%08x";',
        'const char* secret_path = "/etc/megacpp/secret.json";',
        'if (password == "") return false;',
    ],
)
def test_names_prompts_formats_and_paths_assigned_to_secret_names_are_kept(line: str) -> None:
    assert scrubbed(line) == line


# ---- credentials in the shapes real code carries them (the issue's list)

AWS_SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCY/EXAMPLEKEY"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (f"// aws_secret_access_key = {AWS_SECRET}", "// aws_secret_access_key = <API_KEY>"),
        (f"# AWS_SECRET_ACCESS_KEY={AWS_SECRET}", "# AWS_SECRET_ACCESS_KEY=<API_KEY>"),
        (
            f"// export AWS_SECRET_ACCESS_KEY={AWS_SECRET}",
            "// export AWS_SECRET_ACCESS_KEY=<API_KEY>",
        ),
        (f"/* aws_secret_access_key: {AWS_SECRET} */", "/* aws_secret_access_key: <API_KEY> */"),
        # a base64 value may start with `/` or `+` and still not be a path
        ("// secret_key = /K7MDENG+bPxRfiCY/wJalrXUtnFEMI", "// secret_key = <API_KEY>"),
    ],
)
def test_aws_secret_written_unquoted_in_a_comment_is_replaced(line: str, expected: str) -> None:
    assert scrubbed(line) == expected


@pytest.mark.parametrize(
    "password", ["Tr0ub4dor&3", "p@ss!w0rd#2", "Zx9$%^&*?q", "river7546-S", "Hmv-Y127y", "x9%dQm!7"]
)
def test_password_with_punctuation_in_a_plain_std_string_is_replaced(password: str) -> None:
    text = f'std::string password = "{password}";'
    assert scrubbed(text) == 'std::string password = "<PASSWORD>";'


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # quoted and unquoted assignments, in code and in comments
        ('#define DB_PASSWORD "S3cr3t!x"', '#define DB_PASSWORD "<PASSWORD>"'),
        ("#define ADMIN_PASSWORD S3cr3t!x", "#define ADMIN_PASSWORD <PASSWORD>"),
        ('auto dbPass = std::string("S3cr3t!x");', 'auto dbPass = std::string("<PASSWORD>");'),
        ('const std::string PWD = R"(S3c"r3t!x)";', 'const std::string PWD = R"(<PASSWORD>)";'),
        ("// passwd: S3cr3t!x", "// passwd: <PASSWORD>"),
        ("// root_password = S3cr3t!x.", "// root_password = <PASSWORD>."),
        ('// the default pwd is "S3cr3t!x"', '// the default pwd is "<PASSWORD>"'),
        # config snippets, raw and with `\n` escapes
        ('R"ini(\n[db]\ndb_pass = S3cr3t!x\n)ini"', 'R"ini(\n[db]\ndb_pass = <PASSWORD>\n)ini"'),
        (
            'R"yaml(\ndb:\n  password: S3cr3t!x\n)yaml"',
            'R"yaml(\ndb:\n  password: <PASSWORD>\n)yaml"',
        ),
        ('"db:\\n  password: S3cr3t!x\\n"', '"db:\\n  password: <PASSWORD>\\n"'),
        (
            '"{\\"user\\": \\"a\\", \\"password\\": \\"S3cr3t!x\\"}"',
            '"{\\"user\\": \\"a\\", \\"password\\": \\"<PASSWORD>\\"}"',
        ),
        (
            '"DB_HOST=db\\nADMIN_PASSWORD=S3cr3t!x\\n"',
            '"DB_HOST=db\\nADMIN_PASSWORD=<PASSWORD>\\n"',
        ),
        # command lines
        ("// mysql -u app --password=S3cr3t!x prod", "// mysql -u app --password=<PASSWORD> prod"),
        ("// mysql -u root -pS3cr3t!x prod", "// mysql -u root -p<PASSWORD> prod"),
        ("// ./server --db-pass S3cr3t!x", "// ./server --db-pass <PASSWORD>"),
        ('setenv("DB_PASSWORD", "S3cr3t!x", 1);', 'setenv("DB_PASSWORD", "<PASSWORD>", 1);'),
        # URLs and connection strings
        ('"postgres://app:S3cr3t!x@db:5432/p"', '"postgres://app:<PASSWORD>@db:5432/p"'),
        ('"redis://:S3cr3t!x@cache:6379/0"', '"redis://:<PASSWORD>@cache:6379/0"'),
        (
            '"Server=db;User Id=app;Password=S3c&r3t!x;"',
            '"Server=db;User Id=app;Password=<PASSWORD>;"',
        ),
        ('"UID=app;PWD={S3c;r3t!x};"', '"UID=app;PWD={<PASSWORD>};"'),
        # HTTP headers
        (f'"Authorization: Bearer {AWS_SECRET}"', '"Authorization: Bearer <API_KEY>"'),
        (f'{{"X-Api-Key", "{AWS_SECRET}"}},', '{"X-Api-Key", "<API_KEY>"},'),
        (f"// curl -H 'X-Auth-Token: {AWS_SECRET}'", "// curl -H 'X-Auth-Token: <API_KEY>'"),
        (
            f'"https://api.example.com/v1?api_token={AWS_SECRET}&n=1"',
            '"https://api.example.com/v1?api_token=<API_KEY>&n=1"',
        ),
    ],
)
def test_credential_in_each_shape_family_is_replaced(line: str, expected: str) -> None:
    assert scrubbed(line) == expected


@pytest.mark.parametrize(
    "line",
    [
        # an empty value
        'std::string password = "";',
        "// AWS_SECRET_ACCESS_KEY=",
        '"postgres://app:@db/prod"',
        '"Authorization: Bearer "',
        '"UID=app;PWD=;"',
        # a placeholder
        '"postgres://app:<password>@db/prod"',
        'R"yaml(\npassword: ${DB_PASSWORD}\n)yaml"',
        "// export DB_PASSWORD=$DB_PASSWORD_FROM_VAULT",
        '"smtps://relay:%RELAY_PASS%@smtp.contoso.com:465"',
        "// api_key = YOUR_API_KEY_HERE",
        '"Password=********;"',
        # a variable or an expression
        "password = cfg.password;",
        "m_token_produced = !m_token_produced;",
        'req.set_header("Authorization", "Bearer " + access_token);',
        "// export DB_PASSWORD=$(pass show db/prod)",
        # format strings and prose
        'printf("password: %s\\n", pw);',
        'const char* kDsn = "postgres://%s:%s@%s/%s";',
        '"  --password=<pw>      database password (required)\\n"',
        "// Token: IDENTIFIER | NUMBER | STRING",
        # names that spell their own value, numbers, aliases
        '#define SN_setct_AuthResTBS "setct-AuthResTBS"',
        "#define SSL_CTRL_SET_TLS_EXT_SRP_PASSWORD 81",
        "#define ed25519_sha512_set_private_key nettle_ed25519_sha512_set_private_key",
    ],
)
def test_credential_name_with_no_secret_after_it_is_kept(line: str) -> None:
    assert scrubbed(line) == line


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "flood",
    [
        ('"' + "password=" * 2000 + '"\n') * 50,  # each candidate looked at its whole line
        ("mysql -pX" * 5000 + "\n") * 20,  # each `mysql` re-read its line's `-p` flags
        "token" + " " * 200_000 + "x",  # the separators backtracked over the blanks
    ],
)
def test_credential_floods_scrub_in_linear_time(flood: str) -> None:
    started = time.perf_counter()
    scrub_text(flood, CONFIG)
    assert time.perf_counter() - started < 20


# --------------------------------------------------------------------------- private keys


def _pem_lines(label: str) -> list[str]:
    body = "".join(_tok(random.Random(label), ALNUM + "+/", 64) for _ in range(4))
    return [
        f"-----BEGIN {label}-----",
        *[body[i : i + 64] for i in range(0, len(body), 64)],
        f"-----END {label}-----",
    ]


@pytest.mark.parametrize(
    "label", ["RSA PRIVATE KEY", "EC PRIVATE KEY", "OPENSSH PRIVATE KEY", "PGP PRIVATE KEY BLOCK"]
)
def test_pem_block_spelled_as_string_literals_becomes_one_placeholder(label: str) -> None:
    body = "\n".join(f'    "{line}\\n"' for line in _pem_lines(label))
    text = f"static const char kKey[] =\n{body};\n"
    assert scrubbed(text) == 'static const char kKey[] =\n    "<PRIVATE_KEY>\\n";\n'


def test_truncated_pem_block_loses_its_base64_body() -> None:
    lines = _pem_lines("RSA PRIVATE KEY")[:-1]
    text = "/*\n" + "\n".join(lines) + "\n*/\nint x;\n"
    out = scrubbed(text)
    assert out == "/*\n<PRIVATE_KEY>\n*/\nint x;\n"


def test_pem_block_whose_header_has_three_dashes_becomes_one_placeholder() -> None:
    lines = [line.replace("-----", "---") for line in _pem_lines("PRIVATE KEY")]
    text = 'const char* kKey = R"(' + "\n".join(lines) + ')";\n'
    assert scrubbed(text) == 'const char* kKey = R"(<PRIVATE_KEY>)";\n'


def test_three_dash_header_without_key_material_stays() -> None:
    text = 'if (line == "---BEGIN PRIVATE KEY---") {\n  in_key = true;\n}\n'
    assert scrubbed(text) == text


def _ppk(version: int) -> str:
    rng = random.Random(version)
    argon = "Key-Derivation: Argon2id\nArgon2-Memory: 8192\n" if version == 3 else ""
    return (
        f"PuTTY-User-Key-File-{version}: ssh-ed25519\nEncryption: aes256-cbc\n"
        f"Comment: deploy@ci\nPublic-Lines: 2\n{_tok(rng, ALNUM + '+/', 64)}\n"
        f"{_tok(rng, ALNUM, 8)}\n{argon}Private-Lines: 1\n{_tok(rng, ALNUM + '+/', 44)}\n"
        f"Private-MAC: {_tok(rng, '0123456789abcdef', 64)}"
    )


@pytest.mark.parametrize("version", [2, 3])
def test_putty_key_file_of_either_version_becomes_one_placeholder(version: int) -> None:
    text = f'static const char kPpk[] = R"({_ppk(version)})";\nint x;\n'
    assert scrubbed(text) == 'static const char kPpk[] = R"(<PRIVATE_KEY>)";\nint x;\n'


def test_putty_key_file_parser_strings_stay() -> None:
    text = (
        'if (line.rfind("PuTTY-User-Key-File-3: ", 0) == 0) version = 3;\n'
        'else if (line.rfind("Private-MAC: ", 0) == 0) mac = line.substr(13);\n'
    )
    assert scrubbed(text) == text


def test_public_certificate_is_not_a_private_key() -> None:
    text = "\n".join(_pem_lines("CERTIFICATE"))
    assert scrubbed(text) == text


def test_ssh_public_key_with_user_at_host_comment_is_one_placeholder() -> None:
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI" + _tok(random.Random(1), ALNUM, 43)
    text = f'const char* kDeployKey = "{key} alice@build-01.corp.example";'
    out, findings = scrub_text(text, CONFIG)
    assert out == 'const char* kDeployKey = "<SSH_KEY>";'
    assert [f.kind for f in findings] == [Kind.SSH_KEY]  # the comment is not a second email


# --------------------------------------------------------------------------- local paths


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('#line 42 "/home/alice/build/gen/parser.cpp"', '#line 42 "<LOCAL_PATH>"'),
        ("// Built on /Users/bob/dev/fastmath/src/io.cpp", "// Built on <LOCAL_PATH>"),
        (r'"C:\\Users\\carol\\source\\repos\\x.cpp"', '"<LOCAL_PATH>"'),
        (r"// see C:\Users\dmitri\Documents\notes.txt", "// see <LOCAL_PATH>"),
        ('"/tmp/elena-build/CMakeFiles/x.o",', '"<LOCAL_PATH>",'),
        ('#include "/home/farid/proj/include/a.h"', '#include "<LOCAL_PATH>"'),
    ],
)
def test_home_directory_and_per_user_tmp_paths_are_replaced(line: str, expected: str) -> None:
    assert scrubbed(line) == expected


def test_keep_path_tail_replaces_only_the_user_directory() -> None:
    config = ScrubConfig(keep_path_tail=True)
    text = 'const char* p = "/home/alice/proj/src/a.cpp";'
    assert scrubbed(text, config) == 'const char* p = "<LOCAL_PATH>/proj/src/a.cpp";'


@pytest.mark.parametrize(
    "line",
    [
        '#include "users/profile.h"',
        "// installed under /usr/share/doc and /Users/Shared/Library",
        'const char* kTmp = "/tmp/output.txt";',
        'auto home = std::getenv("HOME");  // e.g. /home/<user>',
    ],
)
def test_paths_that_name_no_user_are_kept(line: str) -> None:
    assert scrubbed(line) == line


def test_public_172_addresses_outside_the_private_block_are_replaced() -> None:
    # detect-secrets' pattern skips 172.160-172.255 (its `172\\.2[0-9]` matches `172.24`)
    assert scrubbed('"upstream:\\n  address: 172.240.206.144\\n"') == (
        '"upstream:\\n  address: <IP_ADDRESS>\\n"'
    )
    assert scrubbed('const char* kServer = "172.20.1.1";') == 'const char* kServer = "172.20.1.1";'


def test_object_identifiers_are_not_addresses() -> None:
    line = '#define GNUTLS_OID_X520_NAME "2.5.4.41"'
    assert scrubbed(line) == line


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('"-I/home/alice/proj/include",', '"-I<LOCAL_PATH>",'),
        ('"HOME_DIR=/home/alice/proj\\n"', '"HOME_DIR=<LOCAL_PATH>\\n"'),
        ('"[cache]\\ndir = /Users/bob/cache\\n"', '"[cache]\\ndir = <LOCAL_PATH>\\n"'),
    ],
)
def test_home_path_after_a_flag_or_before_an_escape_is_replaced_alone(
    line: str, expected: str
) -> None:
    assert scrubbed(line) == expected


def test_truncated_key_loses_its_short_last_line_too() -> None:
    lines = [*_pem_lines("RSA PRIVATE KEY")[:-1], "tg=="]
    assert scrubbed("/*\n" + "\n".join(lines) + "\n...\n*/") == "/*\n<PRIVATE_KEY>\n...\n*/"


def test_ssh_key_in_a_raw_string_keeps_the_closing_parenthesis() -> None:
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI" + _tok(random.Random(2), ALNUM, 43)
    text = f'std::string pub = R"({key} alice@laptop)";'
    assert scrubbed(text) == 'std::string pub = R"(<SSH_KEY>)";'


# --------------------------------------------------------------------------- decoys


@pytest.fixture(scope="module")
def eval_set() -> list:
    return build_eval_set(seed=11, per_kind=200, per_decoy_class=40)


@pytest.mark.parametrize("decoy_class", DECOY_CLASSES)
def test_decoys_of_every_false_positive_class_stay_byte_identical(
    eval_set: list, decoy_class: str
) -> None:
    items = [i for i in eval_set if i.category == decoy_class]
    assert items
    altered = [i.item_id for i in items if scrubbed(i.text) != i.text]
    assert altered == []


@pytest.mark.parametrize("kind", [str(k) for k in Kind])
def test_every_kind_in_the_labelled_set_reaches_99_5_percent_exact_output(
    eval_set: list, kind: str
) -> None:
    items = [i for i in eval_set if i.category == kind]
    assert len(items) == 200
    assert len({i.shape for i in items}) >= 20  # the issue: at least 20 distinct shapes a kind
    wrong = [i.item_id for i in items if scrubbed(i.text) != i.expected]
    assert len(wrong) <= 1, wrong


@pytest.mark.parametrize("family", FAMILIES)
def test_every_shape_family_in_the_labelled_set_reaches_99_5_percent_exact_output(
    eval_set: list, family: str
) -> None:
    items = [i for i in eval_set if i.label == "secret" and i.family == family]
    assert len(items) >= 25
    wrong = [i.item_id for i in items if scrubbed(i.text) != i.expected]
    assert len(wrong) <= len(items) // 200, wrong  # none, below 200 items


def test_evaluation_meets_the_issue_targets() -> None:
    report = evaluate(build_eval_set(seed=5, per_kind=200, per_decoy_class=50), CONFIG)
    assert report.min_recall >= 0.995, (report.recall, report.family_recall)
    assert report.altered_decoys == 0, report.failures[:3]


def test_held_out_set_keeps_every_decoy_and_meets_the_targets_too() -> None:
    """The second set shares no word list with the detectors; since issue 27 it is held to
    the same targets as the first (its former gaps: passwords passed by position, XML and
    .netrc, `the password is x`, key names the detectors do not know, homes below /mnt)."""
    report = evaluate(build_heldout_set(seed=3, per_kind=200, per_decoy_class=20), CONFIG)
    assert report.min_recall >= 0.995, (report.recall, report.family_recall)
    assert report.altered_decoys == 0, report.failures[:3]


def test_cpp_specific_decoys_named_by_the_issue_are_kept() -> None:
    text = (
        '#include "mirror/151.101.1.69/net.h"\n'
        "/// @brief Parses user@host. @param spec the text\n"
        'UIImage* i = [UIImage imageNamed:@"icon@2x.png"];\n'
        '__asm__(".symver memcpy,memcpy@GLIBC_2.2.5");\n'
        "static constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ULL;\n"
        'const std::string secret_key_sha256 = "'
        'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";\n'
        'struct __declspec(uuid("6B29FC40-CA47-101B-B31D-00DD010662DA")) IFoo;\n'
        'const char* kRemote = "git@github.com:pybind/pybind11.git";\n'
        "static const int ASIAPACIFICREGIONCODESTABLE_SIZE = 12;\n"
    )
    assert scrubbed(text) == text


# --------------------------------------------------------------------------- contracts


_SCRUB_IN_A_FRESH_INTERPRETER = """
import json, sys
from megacpp_pipeline.gates.scrub import ScrubConfig, scrub_text
out, findings = scrub_text(sys.stdin.read(), ScrubConfig())
print(json.dumps([out, [[str(f.kind), f.detector, f.start_byte, f.end_byte, f.value_hash]
                        for f in findings]]))
"""


def test_a_fresh_interpreter_with_another_hash_seed_gives_the_same_output_and_findings() -> None:
    # independent computations: a second process, with its own set/dict hashing order and
    # its own compiled patterns, must agree byte for byte with this one
    text = "\n".join(i.text for i in build_eval_set(seed=3, per_kind=25, per_decoy_class=2))
    out, findings = scrub_text(text, CONFIG)
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    done = subprocess.run(
        [sys.executable, "-c", _SCRUB_IN_A_FRESH_INTERPRETER],
        input=text,
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    other_out, other_findings = json.loads(done.stdout)
    assert other_out == out
    assert other_findings == [
        [str(f.kind), f.detector, f.start_byte, f.end_byte, f.value_hash] for f in findings
    ]
    assert len(findings) == 7 * 25  # one per planted secret, none across file boundaries


def test_finding_spans_are_utf8_byte_offsets_into_the_input() -> None:
    text = "// Autor: Jürgen Müller — ☃ <juergen.mueller@example.de>, IP 93.184.216.34 (host)\n"
    _, findings = scrub_text(text, CONFIG)
    raw = text.encode()
    spans = [raw[f.start_byte : f.end_byte].decode() for f in findings]
    assert spans == ["juergen.mueller@example.de", "93.184.216.34"]


def test_finding_hash_is_salted_and_never_the_value() -> None:
    _, (finding,) = scrub_text("// alice.smith@corp.example", CONFIG)
    expected = hmac.new(
        CONFIG.audit_salt.encode(), b"alice.smith@corp.example", hashlib.sha256
    ).hexdigest()
    assert finding.value_hash == expected
    _, (other,) = scrub_text("// alice.smith@corp.example", ScrubConfig(audit_salt="another-salt"))
    assert other.value_hash != finding.value_hash
    assert "alice" not in repr(finding)


def test_renamed_placeholders_are_what_the_output_carries() -> None:
    config = ScrubConfig(placeholders=Placeholders(email="[redacted-email]"))
    assert scrubbed("// bob.jones@corp.example", config) == "// [redacted-email]"


def test_placeholder_that_itself_looks_like_a_secret_is_rejected_naming_the_field() -> None:
    with pytest.raises(ValidationError, match=r"placeholders\.email"):
        ScrubConfig(placeholders=Placeholders(email="nobody@corp.example"))
    with pytest.raises(ValidationError, match="distinct"):
        ScrubConfig(placeholders=Placeholders(email="<X>", password="<X>"))


def test_unknown_config_field_fails_before_any_work() -> None:
    with pytest.raises(ValidationError, match="keep_paths"):
        ScrubConfig(keep_paths=True)  # type: ignore[call-arg]


def test_already_scrubbed_text_comes_back_unchanged() -> None:
    text = "\n".join(i.text for i in build_eval_set(seed=9, per_kind=5, per_decoy_class=0))
    once, _ = scrub_text(text, CONFIG)
    twice, findings = scrub_text(once, CONFIG)
    assert twice == once
    assert findings == []


def test_residual_check_finds_a_secret_planted_next_to_a_placeholder() -> None:
    text = '"<EMAIL>" "carol.rossi@corp.example"'
    residual = residual_findings(text, CONFIG)
    assert [(f.kind, f.start_byte) for f in residual] == [(Kind.EMAIL, 11)]


_SECRETS = st.sampled_from(
    [
        "alice.smith@corp.example",
        "93.184.216.34",
        VENDOR_TOKENS["github_token"],
        "/home/alice/proj/a.cpp",
        'password = "Tr0ub4dor3"',
        "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7v2Lx9Q3k8mNzP4tR5sW bob@laptop",
    ]
)
_CODE = st.sampled_from(
    ["int x = 1;", "// note:", "@param", "std::map<K, V>", '"', "<", ">", " ", "\n", "::", "é"]
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(_SECRETS, _CODE), max_size=12))
def test_output_of_any_mix_of_code_and_secrets_has_no_residual_and_is_stable(
    parts: list[str],
) -> None:
    text = " ".join(parts)
    out, findings = scrub_text(text, CONFIG)
    assert residual_findings(out, CONFIG) == []
    assert scrub_text(out, CONFIG) == (out, [])
    raw = text.encode()
    assert all(0 <= f.start_byte < f.end_byte <= len(raw) for f in findings)


# --------------------------------------------------------------------------- run()


FILES = {
    "src/a.cpp": "// Author: Alice Smith <alice.smith@corp.example>\nint a;\n",
    "src/b.hpp": '#pragma once\nconst char* kHost = "93.184.216.34";  // server\n'
    'const char* kDir = "/home/bob/proj";\n',
    "src/c.cpp": "int clean() { return 0; }\n",
}


def test_run_writes_scrubbed_schema_with_new_text_hash_and_counts() -> None:
    result = run(licensed_table(FILES), CONFIG)
    kept = result.kept
    assert kept.schema == schemas.SCRUBBED_FILES
    rows = {r["path"]: r for r in kept.to_pylist()}
    assert rows["src/a.cpp"]["text"] == "// Author: Alice Smith <<EMAIL>>\nint a;\n"
    assert rows["src/b.hpp"]["scrub_replacements"] == 2
    assert rows["src/c.cpp"]["scrub_replacements"] == 0
    for row in rows.values():
        assert row["content_sha256"] == schemas.text_sha256(row["text"])
        assert row["blob_sha"] == schemas.git_blob_sha(FILES[row["path"]].encode())
    assert result.dropped.num_rows == 0
    assert result.stats["kind:email"] == 1
    assert result.stats["kind:ip_address"] == 1
    assert result.stats["kind:local_path"] == 1


def test_audit_names_file_kind_detector_and_span_but_never_the_value() -> None:
    table = licensed_table(FILES)
    audit = run(table, CONFIG).extra["audit"]
    assert audit.schema == AUDIT_SCHEMA
    assert audit.num_rows == 3
    values = ["alice.smith@corp.example", "93.184.216.34", "/home/bob/proj", "alice", "bob"]
    for row in audit.to_pylist():
        raw = FILES[row["path"]].encode()
        original = raw[row["start_byte"] : row["end_byte"]].decode()
        assert original in values
        assert (
            row["value_hash"]
            == hmac.new(CONFIG.audit_salt.encode(), original.encode(), hashlib.sha256).hexdigest()
        )
        assert not any(v in str(cell) for cell in row.values() for v in values)


def _planted_fragments(value: str) -> list[str]:
    """What of a planted secret must not survive: the value, and each line of a multi-line
    one (a PEM block's base64 rows)."""
    rows = [r.strip(' "\\n*/#') for r in value.replace("\\n", "\n").splitlines()]
    return [value, *(r for r in rows if len(r) >= 16 and "BEGIN" not in r and "END" not in r)]


def test_gate_output_holds_none_of_the_planted_secret_values() -> None:
    # the oracle is the labelled set, not the detectors: every secret the set planted is
    # known verbatim, and none of it may be left in what run() keeps
    items = build_eval_set(seed=21, per_kind=60, per_decoy_class=5)
    table = licensed_table({f"{i.item_id}.cpp": i.text for i in items})
    kept = {r["path"]: r["text"] for r in run(table, CONFIG).kept.to_pylist()}
    assert len(kept) == len(items)
    leaks = [
        i.item_id
        for i in items
        if i.label == "secret"
        and any(f in kept[f"{i.item_id}.cpp"] for f in _planted_fragments(i.value))
    ]
    assert leaks == []
    decoys = [i for i in items if i.label == "decoy"]
    assert [i.item_id for i in decoys if kept[f"{i.item_id}.cpp"] != i.text] == []


def test_blocking_check_passes_on_the_gate_output_and_fires_on_its_input() -> None:
    items = build_eval_set(seed=21, per_kind=10, per_decoy_class=5)
    table = licensed_table({f"{i.item_id}.cpp": i.text for i in items})
    result = run(table, CONFIG)
    assert result.kept.num_rows == table.num_rows
    assert residual_table(result.kept, CONFIG).num_rows == 0
    fired = residual_table(table, CONFIG)
    secrets = {f"{i.item_id}.cpp" for i in items if i.label == "secret"}
    assert set(fired.column("path").to_pylist()) == secrets


def test_run_on_an_empty_shard_keeps_the_schema() -> None:
    result = run(licensed_table({}), CONFIG)
    assert result.kept.num_rows == 0
    assert result.kept.schema == schemas.SCRUBBED_FILES
    assert result.extra["audit"].num_rows == 0


def test_markdown_sample_shows_redacted_lines_never_the_values() -> None:
    kept = run(licensed_table(FILES), CONFIG).kept
    sample = markdown_sample(kept, CONFIG)
    assert "| `src/a.cpp` | 1 | `// Author: Alice Smith <<EMAIL>>` |" in sample
    assert "alice.smith" not in sample and "93.184" not in sample
    assert markdown_sample(kept, CONFIG, max_lines=1).count("\n") == 2
    assert markdown_sample(run(licensed_table({"x.cpp": "int x;"}), CONFIG).kept, CONFIG) == (
        "_no redactions in this partition_"
    )


NLOHMANN = Path("/usr/include/nlohmann")


@pytest.mark.skipif(not NLOHMANN.is_dir(), reason="nlohmann-json3-dev headers not installed")
def test_real_headers_lose_their_author_emails_and_pass_the_check() -> None:
    files = {str(p.relative_to(NLOHMANN)): p.read_text() for p in sorted(NLOHMANN.rglob("*.hpp"))}
    table = licensed_table(files, source_id="nlohmann")
    result = run(table, CONFIG)
    assert result.kept.num_rows == table.num_rows
    assert residual_table(result.kept, CONFIG).num_rows == 0
    kinds = {k for k in result.stats if k.startswith("kind:")}
    assert kinds <= {"kind:email"}  # nothing but author addresses in a JSON library


def test_file_that_still_trips_a_detector_after_scrubbing_is_dropped_not_kept() -> None:
    # with keep_path_tail the tail of a path is kept, and this tail holds a second home dir
    config = ScrubConfig(keep_path_tail=True)
    files = {
        "ok.cpp": "// alice.smith@corp.example\n",
        "nested.cpp": "// /home/alice/home/bob/x\n",
    }
    result = run(licensed_table(files), config)
    assert result.kept.column("path").to_pylist() == ["ok.cpp"]
    (drop,) = result.dropped.to_pylist()
    assert (drop["path"], drop["reason"]) == ("nested.cpp", "scrub_failed")
    assert "local_path still detected by local_path" in drop["detail"]
    assert result.stats["scrub_failed"] == 1
    assert set(result.extra["audit"].column("path").to_pylist()) == {"ok.cpp"}


def test_run_gives_every_file_the_same_text_as_scrub_text(eval_set: list) -> None:
    # run() and scrub_text share one detect() (the RE2 screen, then the finders); this
    # proves a shard's rows come out as each file does on its own
    table = licensed_table({i.item_id: i.text for i in eval_set})
    kept = run(table, CONFIG).kept
    assert kept.column("text").to_pylist() == [scrubbed(i.text) for i in eval_set]


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_a_texts_screen_tags_wake_the_detectors_a_visit_of_every_one_would(
    data: st.DataObject,
) -> None:
    """detect() looks rare detectors up by tag; the same ones, in the registry's order (which
    breaks ties between equal hits), as asking each detector in turn."""
    from megacpp_pipeline.gates.scrub.detectors import DETECTORS, _woken

    tags = [f"det:{d.name}" for d in DETECTORS] + ["kw:password", "probe:jwt", "prefixed"]
    seen = frozenset(data.draw(st.lists(st.sampled_from(tags), max_size=8)))
    expected = [
        d for d in DETECTORS if d.screened is not None or d.common or f"det:{d.name}" in seen
    ]
    assert _woken(DETECTORS, seen) == expected
    assert _woken(list(DETECTORS), seen) == expected  # a list: looked up afresh


def test_the_gate_notes_the_sha256_of_each_kept_text_as_it_inspected_it() -> None:
    """`scanned_clean`: a text no detector fired on, by its input bytes; a rewritten one,
    by its replacement (which the second pass found clean); a dropped one, not at all."""
    config = ScrubConfig(keep_path_tail=True)
    files = {
        "clean.cpp": "int answer() { return 42; }\n",
        "mail.cpp": "// alice.smith@corp.example\nint x;\n",
        "nested.cpp": "// /home/alice/home/bob/x\n",  # still trips a detector: dropped
    }
    result = run(licensed_table(files), config)
    kept = result.kept.column("text").to_pylist()
    assert result.kept.column("path").to_pylist() == ["clean.cpp", "mail.cpp"]
    assert kept[1] != files["mail.cpp"]
    assert result.scanned_clean == [schemas.text_sha256(t) for t in kept]
    assert result.scanned_clean == result.kept.column("content_sha256").to_pylist()
    assert residual_table(result.kept, config).num_rows == 0


def test_the_gate_vouches_for_nothing_when_its_text_is_not_the_schema_s_string() -> None:
    table = licensed_table({"a.cpp": "int a;\n"})
    text = table.schema.get_field_index("text")
    viewed = table.set_column(text, "text", table.column("text").cast(pa.string_view()))
    assert run(viewed, CONFIG).scanned_clean is None
