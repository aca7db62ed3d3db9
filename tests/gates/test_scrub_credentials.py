"""The scrub gate on credentials by structure: every way C++ binds a string to a name, auth and
config files pasted into code, tokens of issuers no rule names, and the look-alikes that must
stay (placeholders, hashes, UUIDs, commit ids, test vectors); then the three labelled sets
against the issue's targets, and the rule id carried into findings and ledger details."""

from __future__ import annotations

import base64
import random
import string

import pytest

from megacpp_pipeline.gates.scrub import Finding, Kind, ScrubConfig, ScrubError, scrub_text
from megacpp_pipeline.gates.scrub.credentials import ANCHORS, PASSWORD_WORDS, anchor_positions
from tests.fixtures.scrub_eval import evaluate
from tests.fixtures.scrub_outside import build_outside_set
from tests.gates.test_scrub import licensed_table

CONFIG = ScrubConfig()
_R = random.Random(27)
ALNUM = string.ascii_letters + string.digits


def _tok(alphabet: str, n: int) -> str:
    return "".join(_R.choice(alphabet) for _ in range(n))


def scrubbed(text: str) -> str:
    return scrub_text(text, CONFIG)[0]


# an issuer's token no rule in the vendored file knows by name (prefix, separator, random)
NEW_ISSUER = "zqx_" + _tok(ALNUM, 40)
# a key with no format at all: only a name can say what it is
RANDOM_KEY = _tok(ALNUM + "+/", 40)
PASSWORD = "Winter2024!x"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (f'const char* kRef = "{NEW_ISSUER}";', 'const char* kRef = "<API_KEY>";'),
        (f'std::string kRef{{"{NEW_ISSUER}"}};', 'std::string kRef{"<API_KEY>"};'),
        (f'constexpr char kRef[] = "{NEW_ISSUER}";', 'constexpr char kRef[] = "<API_KEY>";'),
        (
            f'constexpr std::string_view kRef = "{NEW_ISSUER}"sv;',
            'constexpr std::string_view kRef = "<API_KEY>"sv;',
        ),
        (f'#define UPSTREAM_REF "{NEW_ISSUER}"', '#define UPSTREAM_REF "<API_KEY>"'),
        (f'auto r = R"({NEW_ISSUER})";', 'auto r = R"(<API_KEY>)";'),
        (f'Client c("{NEW_ISSUER}");', 'Client c("<API_KEY>");'),
        # split across adjacent literals: one value, one placeholder
        (
            f'const char kRef[] = "{NEW_ISSUER[:15]}" "{NEW_ISSUER[15:]}";',
            'const char kRef[] = "<API_KEY>";',
        ),
        (
            f'const char kRef[] =\n    "{NEW_ISSUER[:20]}"\n    "{NEW_ISSUER[20:]}";',
            'const char kRef[] =\n    "<API_KEY>";',
        ),
    ],
)
def test_issuer_shaped_token_under_a_name_that_says_nothing_is_replaced_in_every_binding(
    line: str, expected: str
) -> None:
    assert scrubbed(line) == expected


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (f'std::string service_key{{"{RANDOM_KEY}"}};', 'std::string service_key{"<API_KEY>"};'),
        (f'{{"api_key", "{RANDOM_KEY}"}},', '{"api_key", "<API_KEY>"},'),
        (
            f'env.emplace("MISTRAL_API_KEY", "{RANDOM_KEY}");',
            'env.emplace("MISTRAL_API_KEY", "<API_KEY>");',
        ),
        (f'setenv("CO_API_KEY", "{RANDOM_KEY}", 1);', 'setenv("CO_API_KEY", "<API_KEY>", 1);'),
        (f'putenv("CO_API_KEY={RANDOM_KEY}");', 'putenv("CO_API_KEY=<API_KEY>");'),
        (f'cfg["signing_key"] = "{RANDOM_KEY}";', 'cfg["signing_key"] = "<API_KEY>";'),
        # a name that only says `key`: the value's own randomness decides
        (
            f'constexpr char kModelHubKey[] = "{RANDOM_KEY}";',
            'constexpr char kModelHubKey[] = "<API_KEY>";',
        ),
        (
            f'const char* SECRET_KEY =\n    "{RANDOM_KEY[:20]}"\n    "{RANDOM_KEY[20:]}";',
            'const char* SECRET_KEY =\n    "<API_KEY>";',
        ),
        (
            'const char* SECRET_KEY = "j(3x!v9+q2)w^kz@7_m$e8#rt0&yb5%p-1s=c4(dh*n6ug";',
            'const char* SECRET_KEY = "<API_KEY>";',
        ),
    ],
)
def test_random_value_bound_to_a_secret_like_name_is_replaced_in_every_binding(
    line: str, expected: str
) -> None:
    assert scrubbed(line) == expected


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            f"// machine ftp.example.org login ci password {PASSWORD}",
            "// machine ftp.example.org login ci password <PASSWORD>",
        ),
        (
            f"/*\nmachine h.example.net\n  login ci\n  password {PASSWORD}\n*/",
            "/*\nmachine h.example.net\n  login ci\n  password <PASSWORD>\n*/",
        ),
        (
            f'"machine h login u password {PASSWORD}\\n"',
            '"machine h login u password <PASSWORD>\\n"',
        ),
        (
            f"// db.example:5432:orders:report:{PASSWORD}",
            "// db.example:5432:orders:report:<PASSWORD>",
        ),
        (
            f"// curl -u admin:{PASSWORD} https://ci.example.com",
            "// curl -u admin:<PASSWORD> https://ci.example.com",
        ),
        (
            f"// docker login -u ci -p {PASSWORD} registry.example.com",
            "// docker login -u ci -p <PASSWORD> registry.example.com",
        ),
        (
            f'R"xml(<password>{PASSWORD}</password>)xml"',
            'R"xml(<password><PASSWORD></password>)xml"',
        ),
        (f"// the router password is {PASSWORD}", "// the router password is <PASSWORD>"),
        (f"// Default login: admin / {PASSWORD}", "// Default login: admin / <PASSWORD>"),
        (
            f"/* kickstart: rootpw --plaintext {PASSWORD} */",
            "/* kickstart: rootpw --plaintext <PASSWORD> */",
        ),
        (f'client.login("svc-backup", "{PASSWORD}");', 'client.login("svc-backup", "<PASSWORD>");'),
        (
            f'mysql_real_connect(c, "db1", "etl", "{PASSWORD}", "sales", 0, 0, 0);',
            'mysql_real_connect(c, "db1", "etl", "<PASSWORD>", "sales", 0, 0, 0);',
        ),
        ('std::string password = "maple297_xw";', 'std::string password = "<PASSWORD>";'),
    ],
)
def test_password_in_an_auth_file_command_or_call_slot_is_replaced(
    line: str, expected: str
) -> None:
    assert scrubbed(line) == expected


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('std::string password = "letmein";', 'std::string password = "<PASSWORD>";'),
        ('const char* db_pass = "sunshine";', 'const char* db_pass = "<PASSWORD>";'),
        ('constexpr char kPassword[] = "dragonfly";', 'constexpr char kPassword[] = "<PASSWORD>";'),
        ('#define WIFI_PASSWORD "sunshine"', '#define WIFI_PASSWORD "<PASSWORD>"'),
        ('params["passwd"] = "letmein";', 'params["passwd"] = "<PASSWORD>";'),
        ('{"password", "letmein"},', '{"password", "<PASSWORD>"},'),
        ('setenv("DB_PASSWORD", "letmein", 1);', 'setenv("DB_PASSWORD", "<PASSWORD>", 1);'),
        ('Db::Db() : m_password("letmein") {}', 'Db::Db() : m_password("<PASSWORD>") {}'),
        ('conn.setPassword("letmein");', 'conn.setPassword("<PASSWORD>");'),
        (
            'QString pwd = QStringLiteral("letmein");',
            'QString pwd = QStringLiteral("<PASSWORD>");',
        ),
        (
            'auto cfg = R"({"user": "bob", "passphrase": "correcthorse"})";',
            'auto cfg = R"({"user": "bob", "passphrase": "<PASSWORD>"})";',
        ),
        ('const char* password = "xqzjvkwpbmtrhlsd";', 'const char* password = "<PASSWORD>";'),
    ],
)
def test_lowercase_word_a_password_name_holds_is_replaced(line: str, expected: str) -> None:
    assert scrubbed(line) == expected


@pytest.mark.parametrize(
    "line",
    [
        'std::string password = "password";',
        'std::string password = "changeme";',
        'std::string password = "xxxxxxxx";',
        'std::string password = "<password>";',
        'std::string password = "${PASSWORD}";',
        'std::string password = "your_password_here";',
        'std::string password = "%s";',
        'std::string password = "mypassword";',
        'EXPECT_EQ(cfg.password, "testpass");',
        '{"password", "string"},',
        'std::string password = "user_password";',
        # the word is an argument of another call, or the name does not hold a password
        'std::string password = getenv("dbpassword");',
        'struct passwd* pwd = getpwnam("daemon");',
        'auto p = keyring.getPassword("production");',
        'EXPECT_TRUE(IsValidPassword("abcdefgh"));',
        'hashtest(version, 2, 16, 1, "password", "somesalt", out);',
        'graph.add_pass("gbuffer", setup);',
        'const char* render_pass = "shadows";',
        'password_strength = "medium";',
    ],
)
def test_placeholder_label_or_lookup_word_beside_a_password_name_stays(line: str) -> None:
    assert scrubbed(line) == line


@pytest.mark.parametrize(
    "name",
    [
        *("passwort", "kennwort", "contrasena", "contraseña", "mot_de_passe", "motDePasse"),
        *("senha", "wachtwoord", "haslo", "hasło", "пароль", "parol", "密码", "mima"),
        *("db_kennwort", "kPasswort", "usuario_senha", "CONTRASEÑA"),
    ],
)
def test_password_named_in_another_language_is_replaced(name: str) -> None:
    assert scrubbed(f'std::string {name} = "{PASSWORD}";') == f'std::string {name} = "<PASSWORD>";'
    assert (
        scrubbed(f'std::string {name} = "sonnenschein";') == f'std::string {name} = "<PASSWORD>";'
    )


@pytest.mark.parametrize("word", sorted(PASSWORD_WORDS))
def test_every_password_word_wakes_the_finder(word: str) -> None:
    line = f'const char* admin_{word} = "{PASSWORD}";'
    assert scrubbed(line) == f'const char* admin_{word} = "<PASSWORD>";'


@pytest.mark.parametrize(
    "line",
    [
        f'std::string parola = "{PASSWORD}";',  # Italian: also just "word"
        f'const char* parole = "{PASSWORD}";',
        'mi_option_set(mimalloc_verbose, "Tr0ub4dor");',
        # a translation table holds the word for "password", not one
        '{"password", "kennwort"},',
        'labels["password"] = "contraseña";',
    ],
)
def test_words_near_a_foreign_password_name_and_its_translations_stay(line: str) -> None:
    assert scrubbed(line) == line


HEX_KEY = _tok("0123456789abcdef", 32)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (f'const char* hmac_key = "{HEX_KEY}";', 'const char* hmac_key = "<API_KEY>";'),
        (
            f'static const char* kHmacKey = "{HEX_KEY}";',
            'static const char* kHmacKey = "<API_KEY>";',
        ),
        (
            f'const char* signing_key = "{HEX_KEY}";  // HMAC-SHA256',
            'const char* signing_key = "<API_KEY>";  // HMAC-SHA256',
        ),
        (
            f'// X-Hub-Signature-256 (HMAC-SHA256)\nconst char* webhook_secret = "{HEX_KEY}";',
            '// X-Hub-Signature-256 (HMAC-SHA256)\nconst char* webhook_secret = "<API_KEY>";',
        ),
        (
            f'// sha256 of the body, signed below\nconst char* api_token = "{HEX_KEY}";',
            '// sha256 of the body, signed below\nconst char* api_token = "<API_KEY>";',
        ),
    ],
)
def test_hex_key_under_a_key_or_secret_name_is_replaced_beside_hash_words(
    line: str, expected: str
) -> None:
    assert scrubbed(line) == expected


@pytest.mark.parametrize(
    "line",
    [
        f'const char* sha256_of_file = "{HEX_KEY}";',
        f'const char* expected_hash = "{HEX_KEY}";',
        f'const char* digest = "{HEX_KEY}";  // sha256',
        f'const char* checksum = "{HEX_KEY}";',
        f'const char* token_sha256 = "{HEX_KEY}";',
        f'const char* hmac_digest = "{HEX_KEY}";  // HMAC-SHA256 of the body',
        f'// RFC 4231 test case 2\nconst char* hmac_key = "{HEX_KEY}";',
        f'// md5 of the test password\nconst char* password = "{HEX_KEY}";',
    ],
)
def test_hex_digest_under_a_hash_name_or_a_standards_test_vector_stays(line: str) -> None:
    assert scrubbed(line) == line


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


PEM = "-----BEGIN PRIVATE KEY-----\n" + _tok(ALNUM + "+/", 64) + "\n-----END PRIVATE KEY-----\n"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            f'R"(//nexus.example/npm/:_auth={_b64("ci:" + PASSWORD)})"',
            'R"(//nexus.example/npm/:_auth=<API_KEY>)"',
        ),
        (
            f'R"({{"auths": {{"ghcr.io": {{"auth": "{_b64("bot:" + PASSWORD)}"}}}}}})"',
            'R"({"auths": {"ghcr.io": {"auth": "<API_KEY>"}}})"',
        ),
        (
            f'"{{\\"auths\\":{{\\"r.io\\":{{\\"auth\\":\\"{_b64("ci:" + PASSWORD)}\\"}}}}}}"',
            '"{\\"auths\\":{\\"r.io\\":{\\"auth\\":\\"<API_KEY>\\"}}}"',
        ),
        (
            f'req.set(http::field::authorization, "Basic {_b64("api:" + PASSWORD)}");',
            'req.set(http::field::authorization, "Basic <API_KEY>");',
        ),
        (
            f'h.set("Authorization", QByteArray("Bearer ") + "{RANDOM_KEY}");',
            'h.set("Authorization", QByteArray("Bearer ") + "<API_KEY>");',
        ),
        (
            f'"https://{NEW_ISSUER}@github.com/acme/fw.git"',
            '"https://<API_KEY>@github.com/acme/fw.git"',
        ),
        (f"    client-key-data: {_b64(PEM)}", "    client-key-data: <PRIVATE_KEY>"),
    ],
)
def test_auth_file_and_header_slots_pasted_into_code_are_replaced(line: str, expected: str) -> None:
    assert scrubbed(line) == expected


@pytest.mark.parametrize(
    "line",
    [
        'const char* api_key = "YOUR_API_KEY_HERE";',
        'R"(\nOPENAI_API_KEY=${OPENAI_API_KEY}\n)"',
        '"Authorization: Bearer <token>"',
        '"[client]\\npassword=changeme\\n"',
        "// machine example.com login USER password PASSWORD",
        'constexpr char kHfToken[] = "hf_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx";',
        f'constexpr char kExpectedSha256[] = "{_tok("0123456789abcdef", 64)}";',
        f"// Fixed upstream in {_tok('0123456789abcdef', 40)}.",
        '#define GIT_COMMIT_HASH "4b825dc642cb6eb9a060e54bf8d69288fbee4904"',
        'const std::string request_id = "550e8400-e29b-41d4-a716-446655440000";',
        '// RFC 4231 test case 1\nconst char* key = "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b";',
        'static const char kAesKey[] = "000102030405060708090a0b0c0d0e0f";  // FIPS-197',
        f'const std::string kFontData = "d09GMgABAAAA{_b64(_tok(ALNUM, 40))}";',
        'const char* key = std::getenv("ANTHROPIC_API_KEY");',
        'auto fp = fingerprint("SHA256:nThbg6kXUpJWGl7E1IGOCspRomTxdCARLviKw6E5SY8");',
        "#define BOOST_TYPEOF_MAKE_OBJ_unsignedchar BOOST_TYPEOF_INTEGRAL_PARAM(unsigned char)",
        "struct get_subranged_BuiltIn2BuiltIn;",
        "// docker run -e POSTGRES_PASSWORD postgres:16",
        "// The password must be at least 12 characters long.",
    ],
)
def test_placeholders_digests_ids_test_vectors_and_names_stay(line: str) -> None:
    assert scrubbed(line) == line


def test_an_address_in_a_connect_call_is_an_address_not_a_password() -> None:
    line = 'sock.connect("2001:41d0:8:e8ad::1", 443);'
    assert scrubbed(line) == 'sock.connect("<IP_ADDRESS>", 443);'


# --------------------------------------------------------------------------- the labelled sets


def test_outside_set_meets_the_issue_targets_on_every_kind_and_family() -> None:
    report = evaluate(build_outside_set(seed=7, per_kind=200, per_decoy_class=30), CONFIG)
    assert report.min_recall >= 0.995, (report.recall, report.family_recall, report.failures[:2])
    assert report.altered_decoys == 0, report.failures[:3]
    assert set(report.recall) == {"api_key", "password", "private_key"}


# --------------------------------------------------------------------------- rule ids


def test_audit_and_residual_name_the_vendored_rule_that_found_a_token() -> None:
    from megacpp_pipeline.gates.scrub import residual_table, run

    token = "lin_api_" + _tok(ALNUM, 40)
    table = licensed_table({"a.cpp": f'const char* kRef = "{token}";\n'})
    audit = run(table, CONFIG).extra["audit"]
    assert audit.column("detector").to_pylist() == ["gitleaks:linear-api-key"]
    residual = residual_table(table, CONFIG)
    assert residual.column("detector").to_pylist() == ["gitleaks:linear-api-key"]


def test_ledger_detail_of_a_file_that_still_trips_a_rule_names_the_rule() -> None:
    finding = Finding(Kind.API_KEY, "gitleaks:linear-api-key", 10, 58, "0" * 64)
    assert "gitleaks:linear-api-key" in str(ScrubError("src/a.cpp", finding))


def _every_occurrence(lowered: str, anchor: str) -> list[int]:
    return [i for i in range(len(lowered)) if lowered.startswith(anchor, i)]


@pytest.mark.parametrize("seed", range(40))
def test_anchor_positions_are_every_occurrence_of_every_anchor(seed: int) -> None:
    """The one-pass anchor scan against a brute force, on text woven from anchors that
    overlap one another (`passecretoken`, `mysqlogin`), anchors' pieces and code; half the
    texts also hold characters of two, three and four UTF-8 bytes (whose byte offsets the
    scan counts back to character offsets)."""
    rnd = random.Random(seed)
    pieces = [*ANCHORS, "p", "s", "ss", "sshpass", "t", "oken", "ecret", "ogin", " ", "_", "="]
    pieces.append("\n")
    if seed % 2 == 0:
        pieces.extend(["é", "中文", "\U0001f600", "pässword"])
    text = "".join(rnd.choice(pieces) for _ in range(rnd.randrange(0, 400)))
    found = anchor_positions(text)
    assert list(found) == list(ANCHORS)
    for anchor in ANCHORS:
        assert found[anchor] == _every_occurrence(text, anchor), anchor


def test_the_anchor_scan_finds_anchors_that_overlap_the_match_before_them() -> None:
    found = anchor_positions("passecretoken mysqlogin")
    assert (found["pass"], found["secret"], found["token"]) == ([0], [3], [8])
    assert (found["mysql"], found["login"]) == ([14], [18])
