"""The vendored gitleaks rule file: pinned, compiled with RE2, and held to each rule's own
examples (tests/fixtures/gitleaks_examples.json, extracted from gitleaks' Go sources at the
pinned commit by scripts/gitleaks_examples.py)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from megacpp_pipeline.gates.scrub import ScrubConfig, scrub_text
from megacpp_pipeline.gates.scrub.plausibility import shannon_entropy
from megacpp_pipeline.gates.scrub.vendor_rules import (
    GITLEAKS_FILE,
    GITLEAKS_SHA256,
    VENDOR_DIR,
    RuleSet,
    VendorRule,
    VendorRulesError,
    candidate_rules,
    default_rules,
    load_rules,
    rule_matches,
)

EXAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "gitleaks_examples.json"
CONFIG = ScrubConfig()


@cache
def _examples() -> dict[str, dict[str, list[str]]]:
    return dict(json.loads(EXAMPLES.read_text())["rules"])


def _rule(rule_id: str) -> VendorRule:
    return next(r for r in default_rules().rules if r.id == rule_id)


def _finds(text: str, rule: VendorRule, rules: RuleSet) -> list[str]:
    if rule not in candidate_rules(text.encode(), rules):
        return []  # its keywords are absent: gitleaks never runs the rule
    return [text[s:e] for s, e in rule_matches(text, rule, rules)]


RULE_IDS = sorted(r.id for r in default_rules().rules)


def test_every_rule_compiles_with_re2_and_only_the_path_only_rule_is_left_out() -> None:
    rules = default_rules()
    assert len(rules.rules) >= 200
    # a newer pin that brings a regex RE2 cannot compile lands here, with RE2's error
    assert [rule_id for rule_id, _ in rules.skipped] == ["pkcs12-file"], rules.skipped
    assert "path-only" in rules.skipped[0][1]


def test_rule_file_that_is_not_the_pinned_one_is_refused_naming_the_file(
    tmp_path: Path,
) -> None:
    edited = tmp_path / "gitleaks.toml"
    edited.write_bytes(GITLEAKS_FILE.read_bytes().replace(b"ghp_", b"ghx_", 1))
    with pytest.raises(VendorRulesError, match=str(edited)) as err:
        load_rules(edited)
    assert GITLEAKS_SHA256 in str(err.value)


def test_licence_file_names_the_origin_commit_and_the_pinned_hash() -> None:
    licence = (VENDOR_DIR / "LICENSE.gitleaks").read_text()
    assert "MIT License" in licence
    assert GITLEAKS_SHA256 in licence
    assert "b58d3f102cf3a2c84cb7f923d05c25c9b1aed84b" in licence


def test_regex_re2_rejects_is_reported_with_its_rule_not_dropped(tmp_path: Path) -> None:
    import hashlib

    text = GITLEAKS_FILE.read_text().replace(
        "regex = '''ghp_[0-9a-zA-Z]{36}'''", "regex = '''ghp_(?=x)[0-9a-zA-Z]{36}'''", 1
    )
    path = tmp_path / "gitleaks.toml"
    path.write_text(text)
    rules = load_rules(path, hashlib.sha256(path.read_bytes()).hexdigest())
    reasons = dict(rules.skipped)
    assert "github-pat" in reasons and "RE2" in reasons["github-pat"]
    assert all(r.id != "github-pat" for r in rules.rules)


def test_every_rule_has_examples_of_its_own_or_drawn_from_its_regex() -> None:
    examples = _examples()
    missing = [r for r in RULE_IDS if not (examples[r]["tps"] or examples[r].get("derived_tps"))]
    assert not missing


def _under_entropy_floor(text: str, rule: VendorRule) -> bool:
    """A random draw (gitleaks' Go tests draw fresh ones each run; the fixture holds one)
    whose secret falls under the rule's entropy floor: gitleaks would not report it either."""
    data = text.encode()
    secrets = [
        data[s:e].decode() for *_, (s, e) in (sp[:2] for sp in rule.regex.spans(data)) if e > s
    ]
    return bool(secrets) and all(shannon_entropy(x) <= rule.entropy for x in secrets)


@pytest.mark.parametrize("rule_id", RULE_IDS)
def test_rule_finds_each_of_its_own_true_positives(rule_id: str) -> None:
    rules, rule = default_rules(), _rule(rule_id)
    entry = _examples()[rule_id]
    examples = entry["tps"] + entry.get("derived_tps", [])
    missed = [tp for tp in examples if not _finds(tp, rule, rules)]
    unexplained = [tp for tp in missed if not _under_entropy_floor(tp, rule)]
    assert not unexplained, unexplained[:3]
    assert len(missed) <= max(1, len(examples) // 20), missed[:3]


# a rule gitleaks runs only on some paths has false positives that are right content in the
# wrong file; the gate applies it to any text (see VendorRule.path_condition)
@pytest.mark.parametrize(
    "rule_id",
    [r for r in RULE_IDS if _examples()[r]["fps"] and _rule(r).path_condition is None],
)
def test_rule_stays_quiet_on_each_of_its_own_false_positives(rule_id: str) -> None:
    rules, rule = default_rules(), _rule(rule_id)
    fired = [(fp, _finds(fp, rule, rules)) for fp in _examples()[rule_id]["fps"]]
    assert not [f for f in fired if f[1]], [f for f in fired if f[1]][:3]


@pytest.mark.parametrize(
    ("line", "rule_id"),
    [
        (
            'constexpr char kHubRef[] = "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";',
            "huggingface-access-token",
        ),
        ('std::string kClaudeProj{"sk-ant-api03-' + "Ab1-" * 23 + 'xAA"};', "anthropic-api-key"),
        ("// lin_api_Kx8uY2dPq9LmN4rTzW1bQ7vC3sE5gH0jA6kM2nP4", "linear-api-key"),
        ('setenv("DO_REF", "dop_v1_' + "0123456789abcdef" * 4 + '", 1);', "digitalocean-pat"),
    ],
)
def test_gate_replaces_a_vendor_token_and_names_the_rule_in_the_finding(
    line: str, rule_id: str
) -> None:
    out, findings = scrub_text(line, CONFIG)
    assert "<API_KEY>" in out, out
    assert [f.detector for f in findings] == [f"gitleaks:{rule_id}"]
