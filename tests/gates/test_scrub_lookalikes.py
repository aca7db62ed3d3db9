"""Ordinary C++ the scrub gate must leave as it is, beside the real thing it must still
replace: each case here was replaced (or left half-replaced) before, found by a review that
varied realistic code around the detectors."""

from __future__ import annotations

import base64
import random

import pytest

from megacpp_pipeline.gates.scrub import ScrubConfig, personal, scrub_text

CONFIG = ScrubConfig()
BODY = "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun"
# a Discord bot token: the bot's id in base64url, a timestamp, an HMAC (D++'s examples)
DISCORD = (
    base64.urlsafe_b64encode(b"1086453067926644942").decode().rstrip("=")
    + ".GhIjKl.Xq9vB2mN4pL7sT0wY3zA6cE8fH1jK5nR9uV2xZ"
)
ED25519_SEED = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60"  # RFC 8032's


def scrubbed(text: str) -> str:
    return scrub_text(text, CONFIG)[0]


@pytest.mark.parametrize(
    "text",
    [
        # a PEM parser's headers and footers, with no key between them
        'if (line == "-----BEGIN RSA PRIVATE KEY-----") {\n  in_key = true;\n'
        '} else if (line == "-----END RSA PRIVATE KEY-----") {\n  in_key = false;\n}\n',
        'static const char* kHeaders[] = {\n  "-----BEGIN PRIVATE KEY-----",\n'
        '  "-----BEGIN RSA PRIVATE KEY-----",\n  "-----BEGIN EC PRIVATE KEY-----",\n};\n',
        "// Expects input like -----BEGIN PRIVATE KEY-----\n"
        "// followed by base64 data and a footer\n// The parser handles both RSA and EC keys\n",
        'const char* kTemplate = "-----BEGIN PRIVATE KEY-----\\n<your key here>\\n";\n',
        # mkstemp templates, sockets, locks and tools' files in /tmp are no one's folder
        'char tmpl[] = "/tmp/test-XXXXXX";\nint fd = mkstemp(tmpl);\n',
        'addr.sun_path = "/tmp/mysql-server.sock";\n',
        'auto lock = "/tmp/app-instance.lock";\n',
        "// core dumps go to /tmp/core-%e-%p\n",
        'auto p = "/tmp/build-output/x.o";\n',
        # accounts of CI runners, images and boards
        "// /home/runner/work/proj/proj/src/x.cpp\n",
        'auto p = "/home/ubuntu/data";\n',
        'auto p = "/home/pi/sketchbook";\n',
        'auto p = "/Users/runner/work/proj";\n',
        # documentation domains
        "// e.g. user@example.com\n",
        'EXPECT_TRUE(IsValidEmail("first.last@mail.example.org"));\n',
        # a public key, a websocket nonce, a cache key are no credentials
        'const char* public_key = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEZk3PL0vWmX7yTr2Nb'
        'Fh5GdJs9ACe1uKo6iRpYwq8Zk3PL0vWmX7yTr2NbFh5GdJs9ACe1uKo6A==";\n',
        'req.set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==");\n',
        # a placeholder, whichever rule finds it (gitleaks' Terraform rule matched it)
        'const char* password = "changeme";\n',
        'WiFi.begin("MyNet", "YOUR_PASSWORD");\n',
        "WiFi.begin(ssid, password);\n",
        'auto c = credentials("label", "value");\n',
        # crypt(3) hashes and salts, a standard's test vector, a trace id, a mechanism's name
        'EXPECT_TRUE(bcrypt_checkpw("password", '
        '"$2a$10$N9qo8uLOickgx2ZMRZoMyeIjZAgcfl7p92ldGxad68LJZdL17lhWy"));\n',
        'EXPECT_EQ(crypt("password", "$6$saltsalt$"), expected);\n',
        f'// RFC 8032 TEST 1\nconst char* secret_key = "{ED25519_SEED}";\n',
        'headers["traceparent"] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";\n',
        'auth_method = "SCRAM-SHA-256";\n',
        "auto f = MainWindowControllerImpl.update.someVeryLongFunctionNameHereX;\n",
        "// version 1.2.3.4\n",
    ],
)
def test_lookalikes_are_left_as_they_are(text: str) -> None:
    assert scrubbed(text) == text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            f'const char* kKey =\n  "-----BEGIN RSA PRIVATE KEY-----\\n"\n  "{BODY}\\n"\n'
            '  "-----END RSA PRIVATE KEY-----\\n";\n',
            'const char* kKey =\n  "<PRIVATE_KEY>\\n";\n',
        ),
        (f"-----BEGIN PRIVATE KEY-----\n{BODY}\n{BODY}\n", "<PRIVATE_KEY>\n"),
        ('auto dir = "/tmp/jsmith-build/obj/a.o";\n', 'auto dir = "<LOCAL_PATH>";\n'),
        ("// jörg.müller@firma.de\n", "// <EMAIL>\n"),
        ("// jörg@müller-bau.de\n", "// <EMAIL>\n"),
        ('pass_ = "Tr0ub4dor&3";\n', 'pass_ = "<PASSWORD>";\n'),
        # a call binds every literal, not only its first: the AWS SDK's secret is second
        (
            'Aws::Auth::AWSCredentials credentials("AKIA4QWERTYZXCVBNM12", '
            '"q8Zk3PL0vWmX7yTr2NbFh5GdJs9ACe1uKo6iRpYw");\n',
            'Aws::Auth::AWSCredentials credentials("<API_KEY>", "<API_KEY>");\n',
        ),
        ('Credentials creds{"bob", "Tr0ub4dor&3"};\n', 'Credentials creds{"bob", "<PASSWORD>"};\n'),
        # Arduino / ESP Wi-Fi: the password's place in the call, the examples' STAPSK
        (
            'WiFi.begin("MyHomeWifi", "sunshine42home");\n',
            'WiFi.begin("MyHomeWifi", "<PASSWORD>");\n',
        ),
        ('WiFi.softAP("ESP-AP", "ap-pass-2024");\n', 'WiFi.softAP("ESP-AP", "<PASSWORD>");\n'),
        ('#define STAPSK "sunshine42"\n', '#define STAPSK "<PASSWORD>"\n'),
        (f'dpp::cluster bot("{DISCORD}");\n', 'dpp::cluster bot("<API_KEY>");\n'),
        # a URL's host is an address, whatever words (`build`) are near it
        (
            "// build artifacts at http://52.14.88.201/builds\n",
            "// build artifacts at http://<IP_ADDRESS>/builds\n",
        ),
        # the same key with no test vector named near it; a bot token's digits prefix
        (
            f'const char* secret_key = "{ED25519_SEED}";\n',
            'const char* secret_key = "<API_KEY>";\n',
        ),
        (
            'const char* bot = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw";\n',
            'const char* bot = "<API_KEY>";\n',
        ),
    ],
)
def test_the_real_thing_beside_them_is_still_replaced_whole(text: str, expected: str) -> None:
    assert scrubbed(text) == expected


def test_ipv4_found_line_by_line_is_the_whole_texts_search() -> None:
    """find_ip runs detect-secrets' pattern only on lines holding a dotted quad: it must
    find exactly what the pattern finds over the whole text, edges and all."""
    rnd = random.Random(7)
    texts = [
        "".join(rnd.choice("0123456789.\n a:x") for _ in range(rnd.randint(0, 60)))
        for _ in range(5000)
    ]
    texts += ["// server 52.14.88.201\nint x = 1.2;\n10.0.0.1 8.8.8.8.8\n1.2.3.4"]
    for text in texts:
        whole = [m.span() for m in personal._IPV4.finditer(text)]
        assert [m.span() for m in personal._ipv4_matches(text)] == whole, repr(text)
