"""Extracts each gitleaks rule's own examples (the `tps` true positives and `fps` false
positives its Go generator validates) into tests/fixtures/gitleaks_examples.json, for the
data-driven tests of the vendored rule file. Run against a gitleaks git directory at the
pinned commit (megacpp_pipeline/gates/scrub/vendor/LICENSE.gitleaks names it):

    .venv/bin/python scripts/gitleaks_examples.py GIT_DIR [--commit SHA] [--out PATH]

The Go sources build many examples at run time (`secrets.NewSecret(regex)`, sample lines
from `utils.GenerateSampleSecrets`); this evaluates that small expression language with a
seeded generator, so the output is one fixed draw. An expression it cannot evaluate is
counted under "unevaluated" in the output, never dropped without a word.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

try:  # Python 3.11+: the regex parser lives here
    from re import _parser as sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover
    import sre_parse  # type: ignore[no-redef]

RULES_DIR = "cmd/generate/config/rules"
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "tests/fixtures/gitleaks_examples.json"

# utils.GenerateSampleSecrets' templates, as in cmd/generate/config/utils/generate.go
SAMPLE_TEMPLATES = (
    '{i}Token="{s}"',
    '{i}Token = "{s}"',
    "{i}Token={s}",
    "{i}Token = {s}",
    '{\n    "{i}_token": "{s}"\n}',
    '{"config.ini": "{I}_TOKEN={s}\\nBACKUP_ENABLED=true"}',
    "<{i}Token>\n    {s}\n</{i}Token>",
    "{i}_token: {s}",
    "{i}_token: '{s}'",
    '{i}_token: "{s}"',
    'string {i}Token = "{s}";',
    'var {i}Token string = "{s}"',
    '{i}Token := "{s}"',
    "{i}Token := `{s}`",
    'String {i}Token = "{s}";',
    'var {i}Token = "{s}"',
    '${i}Token .= "{s}"',
    "{i}Token = '{s}'",
    '{i}Token = "{s}"',
    'System.setProperty("{I}_TOKEN", "{s}")',
    '  "{i}Token" => "{s}"',
    '{i}_TOKEN = "{s}"',
    '{i}_TOKEN := "{s}"',
    '{i}_TOKEN ::= "{s}"',
    '{i}_TOKEN :::= "{s}"',
    '{i}_TOKEN ?= "{s}"',
)
PATTERNS = {
    "utils.Numeric": "[0-9]{%s}",
    "utils.Hex": "[a-f0-9]{%s}",
    "utils.AlphaNumeric": "[a-z0-9]{%s}",
    "utils.AlphaNumericExtendedShort": "[a-z0-9_-]{%s}",
    "utils.AlphaNumericExtended": "[a-z0-9=_\\-]{%s}",
    "utils.AlphaNumericExtendedLong": "[a-z0-9\\/=_\\+\\-]{%s}",
}


class Unsupported(Exception):
    pass


# ---- a random string matching a (simple) regex, as lucasjones/reggen draws one


def _draw(parsed: Any, rng: random.Random, groups: dict[int, str]) -> str:
    out = []
    for op, av in parsed:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(av))
        elif name == "NOT_LITERAL":
            out.append(rng.choice([c for c in "abcdefgh0123" if ord(c) != av]))
        elif name == "ANY":
            out.append(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789"))
        elif name == "IN":
            out.append(_draw_class(av, rng))
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            lo, hi, sub = av
            hi = lo + 1 if hi == sre_parse.MAXREPEAT else hi
            for _ in range(rng.randint(lo, min(hi, lo + 1) if lo else max(hi, 1))):
                out.append(_draw(sub, rng, groups))
        elif name == "SUBPATTERN":
            group, _, _, sub = av
            text = _draw(sub, rng, groups)
            if group:
                groups[group] = text
            out.append(text)
        elif name == "BRANCH":
            out.append(_draw(rng.choice(av[1]), rng, groups))
        elif name == "GROUPREF":
            out.append(groups.get(av, ""))
        elif name in ("AT", "ASSERT", "ASSERT_NOT"):
            continue
        else:
            raise Unsupported(f"regex op {name}")
    return "".join(out)


def _draw_class(items: Any, rng: random.Random) -> str:
    chars: list[str] = []
    negate = False
    for op, av in items:
        name = str(op)
        if name == "NEGATE":
            negate = True
        elif name == "LITERAL":
            chars.append(chr(av))
        elif name == "RANGE":
            chars.extend(chr(c) for c in range(av[0], av[1] + 1))
        elif name == "CATEGORY":
            cat = str(av)
            if "DIGIT" in cat:
                chars.extend("0123456789")
            elif "WORD" in cat:
                chars.extend("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
            elif "SPACE" in cat:
                chars.append(" ")
            else:
                raise Unsupported(f"class category {cat}")
        else:
            raise Unsupported(f"class op {name}")
    if negate:
        chars = [c for c in "abcdefghijklmnopqrstuvwxyz0123456789" if c not in chars]
    return rng.choice(chars)


def new_secret(pattern: str, rng: random.Random) -> str:
    try:
        return _draw(sre_parse.parse(pattern), rng, {})
    except (re.error, ValueError, IndexError) as exc:
        raise Unsupported(f"regex {pattern!r}: {exc}") from exc


# ---- Go tokens and the small expression language of the rule files

_TOKEN = re.compile(
    r"(?P<ws>[ \t\r]+)|(?P<nl>\n)|(?P<comment>//[^\n]*|/\*.*?\*/)"
    r"|(?P<raw>`[^`]*`)|(?P<str>\"(?:[^\"\\\n]|\\.)*\")|(?P<rune>'(?:[^'\\\n]|\\.)+')"
    r"|(?P<ident>[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*)|(?P<num>\d+(?:\.\d+)?)"
    r"|(?P<op>\.\.\.|:=|\+=|==|!=|&&|\|\||[-+*/%(){}\[\],;:=.&!<>|])",
    re.DOTALL,
)


def _go_string(tok: str) -> str:
    if tok.startswith("`"):
        return tok[1:-1].replace("\r", "")
    body = tok[1:-1]
    return json.loads('"' + body.replace("\\'", "'").replace("\\x", "\\u00") + '"')


def tokens(source: str) -> list[tuple[str, str]]:
    out = []
    for m in _TOKEN.finditer(source):
        kind = m.lastgroup or ""
        if kind in ("ws", "comment"):
            continue
        out.append((kind, m.group(0)))
    return out


class Evaluator:
    def __init__(self, toks: list[tuple[str, str]], rng: random.Random) -> None:
        self.toks = toks
        self.rng = rng
        self.env: dict[str, Any] = {}
        self.unevaluated: list[str] = []

    def _span_end(self, i: int, stops: set[str]) -> int:
        """Index of the first stop token at depth 0 from i (newlines stop too at depth 0
        unless the line ends with an operator that continues it)."""
        depth = 0
        while i < len(self.toks):
            kind, tok = self.toks[i]
            if depth == 0 and (tok in stops or (kind == "nl" and "\n" in stops)):
                prev = self.toks[i - 1][1] if i else ""
                if not (kind == "nl" and prev in ("+", ",", "(", "{", "=", ":=")):
                    return i
            if tok in "([{" and kind == "op":
                depth += 1
            elif tok in ")]}" and kind == "op":
                depth -= 1
                if depth < 0:
                    return i
            i += 1
        return i

    def value(self, lo: int, hi: int) -> Any:
        toks = [t for t in self.toks[lo:hi] if t[0] != "nl"]
        value, rest = self._expr(toks)
        if rest:
            raise Unsupported("trailing tokens " + " ".join(t for _, t in rest[:5]))
        return value

    def _expr(self, toks: list[tuple[str, str]]) -> tuple[Any, list[tuple[str, str]]]:
        value, toks = self._term(toks)
        while toks and toks[0][1] == "+":
            right, toks = self._term(toks[1:])
            if not (isinstance(value, str) and isinstance(right, str)):
                raise Unsupported("+ on non-strings")
            value += right
        return value, toks

    def _args(self, toks: list[tuple[str, str]]) -> tuple[list[Any], list[tuple[str, str]]]:
        args: list[Any] = []
        assert toks[0][1] == "("
        toks = toks[1:]
        while toks and toks[0][1] != ")":
            value, toks = self._expr(toks)
            if toks and toks[0][1] == "...":
                value, toks = ("...", value), toks[1:]
            args.append(value)
            if toks and toks[0][1] == ",":
                toks = toks[1:]
        if not toks:
            raise Unsupported("unclosed call")
        return args, toks[1:]

    def _list(self, toks: list[tuple[str, str]]) -> tuple[list[Any], list[tuple[str, str]]]:
        """`[]string{...}` after its `{`: elements that do not evaluate are counted."""
        items: list[Any] = []
        while toks and toks[0][1] != "}":
            depth, j = 0, 0
            while j < len(toks):
                t = toks[j][1]
                if depth == 0 and t in (",", "}", ":"):
                    break
                depth += t in ("(", "[", "{")
                depth -= t in (")", "]", "}")
                j += 1
            try:
                value, rest = self._expr(toks[:j])
                if rest:
                    raise Unsupported("trailing tokens in element")
                items.extend(value if isinstance(value, list) else [value])
            except Unsupported as exc:
                self.unevaluated.append(f"{' '.join(t for _, t in toks[:j])[:80]} ({exc})")
            sep = j < len(toks) and toks[j][1] in (",", ":")
            toks = toks[j + 1 :] if sep else toks[j:]
        return items, toks[1:]

    def _term(self, toks: list[tuple[str, str]]) -> tuple[Any, list[tuple[str, str]]]:
        if not toks:
            raise Unsupported("empty expression")
        kind, tok = toks[0]
        if kind in ("raw", "str"):
            return _go_string(tok), toks[1:]
        if tok == "map" and len(toks) > 5 and toks[4][1] == "string" and toks[5][1] == "{":
            # ValidateWithPaths' {path: content} maps: the contents are the examples
            items, rest = self._list(toks[6:])
            return items[1::2] if len(items) % 2 == 0 else items, rest
        if tok == "[" and len(toks) > 3 and toks[1][1] == "]" and toks[2][1] == "string":
            if toks[3][1] != "{":
                raise Unsupported("slice form")
            return self._list(toks[4:])
        if kind == "ident" and len(toks) > 1 and toks[1][1] == "(":
            args, rest = self._args(toks[1:])
            return self._call(tok, args), rest
        if kind == "ident" and tok in self.env:
            return self.env[tok], toks[1:]
        raise Unsupported(f"term {tok!r}")

    def _call(self, name: str, args: list[Any]) -> Any:
        if name in PATTERNS:
            return PATTERNS[name] % args[0]
        if name == "utils.Hex8_4_4_4_12":
            return "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
        if name == "secrets.NewSecret":
            return new_secret(args[0], self.rng)
        if name == "utils.GenerateSampleSecret":
            return f'{args[0]}_api_token = "{args[1]}"'
        if name == "utils.GenerateSampleSecrets":
            i, s = args
            return [
                t.replace("{i}", i).replace("{I}", i.upper()).replace("{s}", s)
                for t in SAMPLE_TEMPLATES
            ]
        if name == "fmt.Sprintf":
            fmt, *rest = args
            return re.sub(r"%[sdvq]", lambda _: str(rest.pop(0)), fmt)
        if name == "append":
            base, *more = args
            out = list(base)
            for m in more:
                if isinstance(m, tuple) and m[0] == "...":
                    out.extend(m[1])
                else:
                    out.append(m)
            return out
        if name == "strings.Repeat":
            return args[0] * int(args[1])
        raise Unsupported(f"call {name}")

    def run(self, lo: int, hi: int) -> None:
        i = lo
        while i < hi:
            kind, tok = self.toks[i]
            if kind == "ident" and i + 1 < hi and self.toks[i + 1][1] in (":=", "="):
                end = self._span_end(i + 2, {"\n", ";", "}"})
                try:
                    self.env[tok] = self.value(i + 2, end)
                except Unsupported as exc:
                    if tok in ("tps", "fps"):
                        self.unevaluated.append(f"{tok} = ... ({exc})")
                i = end
            elif tok == "var" and i + 3 < hi and self.toks[i + 2][1] == "=":
                end = self._span_end(i + 3, {"\n", ";", "}"})
                try:
                    self.env[self.toks[i + 1][1]] = self.value(i + 3, end)
                except Unsupported as exc:
                    self.unevaluated.append(f"var ... ({exc})")
                i = end
            else:
                i += 1


_FUNC = re.compile(r"^func (?P<name>\w+)\(\) \*config\.Rule \{$", re.MULTILINE)
_RULE_ID = re.compile(r'RuleID:\s*"(?P<id>[^"]+)"')


def examples(source: str, seed: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    # package-level `var x = []string{...}` that the rule functions read
    file_env = Evaluator(tokens(source), random.Random(f"{seed}:file"))
    file_env.run(0, len(file_env.toks))
    starts = [m for m in _FUNC.finditer(source)]
    for n, m in enumerate(starts):
        body = source[m.end() : starts[n + 1].start() if n + 1 < len(starts) else len(source)]
        rule = _RULE_ID.search(body)
        if rule is None:
            continue
        ev = Evaluator(tokens(body), random.Random(f"{seed}:{rule.group('id')}"))
        ev.env = {k: v for k, v in file_env.env.items() if k not in ("tps", "fps")}
        ev.run(0, len(ev.toks))
        tps = [t for t in ev.env.get("tps", []) if isinstance(t, str)]
        fps = [t for t in ev.env.get("fps", []) if isinstance(t, str)]
        out[rule.group("id")] = {
            "function": m.group("name"),
            "tps": tps,
            "fps": fps,
            "unevaluated": ev.unevaluated,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("git_dir", type=Path)
    ap.add_argument("--commit", default="b58d3f102cf3a2c84cb7f923d05c25c9b1aed84b")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()

    def git(*cmd: str) -> str:
        return subprocess.run(
            ["git", f"--git-dir={args.git_dir}", *cmd], check=True, capture_output=True, text=True
        ).stdout

    names = [p for p in git("ls-tree", "--name-only", args.commit, RULES_DIR + "/").split()]
    rules: dict[str, Any] = {}
    for name in sorted(p for p in names if p.endswith(".go")):
        rules.update(examples(git("show", f"{args.commit}:{name}"), args.commit))
    # rules whose Go source holds no true positive get examples drawn from their own regex
    # (kept apart as "derived", so nobody mistakes them for gitleaks' own)
    toml = tomllib.loads(git("show", f"{args.commit}:config/gitleaks.toml"))
    for raw in toml["rules"]:
        entry = rules.setdefault(
            raw["id"], {"function": None, "tps": [], "fps": [], "unevaluated": []}
        )
        entry["derived_tps"] = []
        if entry["tps"] or "regex" not in raw:
            continue
        rng = random.Random(f"{args.commit}:derived:{raw['id']}")
        pattern = raw["regex"].replace("\\z", "\\Z")
        for _ in range(3):
            try:
                entry["derived_tps"].append(new_secret(pattern, rng))
            except Unsupported as exc:
                entry["unevaluated"].append(f"derived from regex ({exc})")
                break
    doc = {
        "origin": f"gitleaks {args.commit} {RULES_DIR}/*.go",
        "licence": "MIT (megacpp_pipeline/gates/scrub/vendor/LICENSE.gitleaks)",
        "rules": rules,
    }
    args.out.write_text(json.dumps(doc, indent=1, ensure_ascii=False, sort_keys=True) + "\n")
    n_tp = sum(len(r["tps"]) for r in rules.values())
    n_fp = sum(len(r["fps"]) for r in rules.values())
    n_un = sum(len(r["unevaluated"]) for r in rules.values())
    n_dv = sum(len(r.get("derived_tps", [])) for r in rules.values())
    print(f"{len(rules)} rules, {n_tp} tps, {n_fp} fps, {n_dv} derived, {n_un} unevaluated")
    sys.exit(0)


if __name__ == "__main__":
    main()
