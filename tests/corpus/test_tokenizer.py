"""The tokenizer artifact: deterministic training, fixed special ids, placeholders as single
tokens, and a pinned artifact that refuses to load under the wrong sha256."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError
from tokenizers import Tokenizer

from megacpp_pipeline.corpus.tokenizer import (
    EOS,
    PLACEHOLDER_TOKENS,
    SPECIAL_TOKENS,
    SpecialIds,
    TokenizerArtifactError,
    TokenizerConfig,
    TokenizerMode,
    effective_fraction,
    load_tokenizer,
    obtain_tokenizer,
    save_tokenizer,
    train_tokenizer,
    training_pieces,
    training_sample,
)
from megacpp_pipeline.storage.versions import sha256_file

CPP_FILES = [
    """// Copyright 2024 Example Authors. SPDX-License-Identifier: MIT
#pragma once
#include <vector>
#include <string_view>

namespace geo {
template <typename T>
struct Point {
    T x{}, y{};
    constexpr Point operator+(const Point& o) const noexcept { return {x + o.x, y + o.y}; }
};
}  // namespace geo
""",
    """#include "geo/point.hpp"
#include <cstdio>

int main(int argc, char** argv) {
    geo::Point<int> p{1, 2}, q{3, 4};
    auto r = p + q;
    std::printf("%d %d\\n", r.x, r.y);  // prints 4 6
    return argc > 1 ? 1 : 0;
}
""",
    """/* Maintainer: <EMAIL>, mirror at <IP_ADDRESS> */
class Registry final {
  public:
    explicit Registry(std::size_t capacity) : slots_(capacity) {}
    [[nodiscard]] bool empty() const { return slots_.empty(); }
  private:
    std::vector<int> slots_;
    static constexpr const char* kKey = "<API_KEY>";
};
""",
    "// Größe des Puffers: 世界 — ünïcödé in comments is common\nusing Buffer = char[64];\n",
]


def corpus(copies: int = 30) -> list[str]:
    # Vary the files a little so BPE has real merge statistics to choose from.
    return [text.replace("geo", f"geo{i % 7}") for i in range(copies) for text in CPP_FILES]


SMALL = TokenizerConfig(vocab_size=600, min_frequency=2)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return train_tokenizer(corpus(), SMALL)


def test_two_trainings_on_the_same_corpus_give_byte_identical_tokenizer_json(
    tmp_path: Path,
) -> None:
    first = save_tokenizer(train_tokenizer(corpus(), SMALL), tmp_path / "a.json")
    second = save_tokenizer(train_tokenizer(corpus(), SMALL), tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert first.sha256 == second.sha256 == sha256_file(tmp_path / "a.json")


def test_training_in_a_fresh_process_gives_the_same_bytes(tmp_path: Path) -> None:
    # Rust hash maps are seeded per process; the artifact must not depend on that.
    texts = tmp_path / "texts.json"
    texts.write_text(json.dumps(corpus()))
    script = (
        "import json, sys\n"
        "from megacpp_pipeline.corpus.tokenizer import TokenizerConfig, train_tokenizer\n"
        "texts = json.loads(open(sys.argv[1]).read())\n"
        "cfg = TokenizerConfig(vocab_size=600, min_frequency=2)\n"
        "sys.stdout.write(train_tokenizer(texts, cfg).to_str(pretty=True))\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", script, str(texts)],
        check=True,
        capture_output=True,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert out.stdout == train_tokenizer(corpus(), SMALL).to_str(pretty=True)


def test_special_tokens_have_fixed_ids_in_declared_order(tokenizer: Tokenizer) -> None:
    for expected_id, token in enumerate(SPECIAL_TOKENS):
        assert tokenizer.token_to_id(token) == expected_id
    ids = SpecialIds()
    assert (ids.bos, ids.eos, ids.pad) == (0, 1, 2)
    assert (ids.fim_prefix, ids.fim_middle, ids.fim_suffix) == (3, 4, 5)


@pytest.mark.parametrize("placeholder", PLACEHOLDER_TOKENS)
def test_a_scrub_placeholder_is_always_one_token(tokenizer: Tokenizer, placeholder: str) -> None:
    text = f'static const char* secret = "{placeholder}";  // was {placeholder}x\n'
    enc = tokenizer.encode(text, add_special_tokens=False)
    placeholder_id = SPECIAL_TOKENS.index(placeholder)
    assert enc.ids.count(placeholder_id) == 2
    assert tokenizer.decode(enc.ids, skip_special_tokens=False) == text


def test_literal_control_token_text_in_a_source_file_stays_text(tokenizer: Tokenizer) -> None:
    text = f'const char* marker = "{EOS}";\n'
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert SpecialIds().eos not in ids
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_byte_level_bpe_round_trips_multibyte_text(tokenizer: Tokenizer) -> None:
    text = "// 世界 — naïve ümlaut 🚀 emoji\nint x = 0;\r\n\ttab\n"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_pinned_artifact_with_a_different_sha256_is_refused_naming_the_file(
    tokenizer: Tokenizer, tmp_path: Path
) -> None:
    path = tmp_path / "tokenizer.json"
    info = save_tokenizer(tokenizer, path)
    wrong = "0" * 64
    with pytest.raises(TokenizerArtifactError, match="sha256 mismatch") as err:
        load_tokenizer(path, wrong)
    assert str(path) in str(err.value)
    assert info.sha256 in str(err.value)


def test_an_artifact_is_parsed_once_per_process_and_its_bytes_checked_at_every_load(
    tokenizer: Tokenizer, tmp_path: Path
) -> None:
    """A per-source gate and its check load the same artifact for every source: parsed
    once and shared, but a file whose bytes no longer hash to the pin is refused even after
    the pin was loaded."""
    path = tmp_path / "tokenizer.json"
    info = save_tokenizer(tokenizer, path)
    first = load_tokenizer(path, info.sha256)
    assert load_tokenizer(path, info.sha256) is first
    copy = tmp_path / "copy.json"
    copy.write_bytes(path.read_bytes())
    assert load_tokenizer(copy, info.sha256) is first
    path.write_bytes(path.read_bytes().replace(b"<|eos|>", b"<|eoz|>", 1))
    with pytest.raises(TokenizerArtifactError, match="sha256 mismatch") as err:
        load_tokenizer(path, info.sha256)
    assert str(path) in str(err.value)
    assert load_tokenizer(copy, info.sha256) is first


def test_pinned_artifact_loads_and_encodes_like_the_trained_one(
    tokenizer: Tokenizer, tmp_path: Path
) -> None:
    path = tmp_path / "tokenizer.json"
    info = save_tokenizer(tokenizer, path)
    pinned = obtain_tokenizer(TokenizerConfig(path=str(path), sha256=info.sha256))
    text = CPP_FILES[2] + f"// {EOS}\n"
    assert (
        pinned.encode(text, add_special_tokens=False).ids
        == tokenizer.encode(text, add_special_tokens=False).ids
    )


def test_artifact_whose_special_ids_moved_is_refused(tmp_path: Path) -> None:
    from tokenizers import models

    other = Tokenizer(models.BPE())
    other.add_special_tokens(["<|eos|>", "<|bos|>"])
    path = tmp_path / "foreign.json"
    other.save(str(path))
    with pytest.raises(TokenizerArtifactError, match="must have id 0"):
        load_tokenizer(path, sha256_file(path))


def test_describe_records_what_the_manifest_needs(tokenizer: Tokenizer, tmp_path: Path) -> None:
    info = save_tokenizer(tokenizer, tmp_path / "tokenizer.json")
    assert info.vocab_size == tokenizer.get_vocab_size()
    assert list(info.special_tokens) == list(SPECIAL_TOKENS)
    assert info.special_tokens["<LOCAL_PATH>"] == len(SPECIAL_TOKENS) - 1
    assert info.normalizer is None
    assert info.pre_tokenizer is not None and info.pre_tokenizer["type"] == "ByteLevel"
    assert info.decoder is not None and info.decoder["type"] == "ByteLevel"
    assert info.model_type == "BPE"
    assert info.tokenizers_version


def test_a_pin_needs_both_path_and_sha256() -> None:
    with pytest.raises(ValidationError, match="both"):
        TokenizerConfig(path="tokenizer.json")
    with pytest.raises(ValidationError, match="sha256"):
        TokenizerConfig(path="tokenizer.json", sha256="not-a-hash")
    with pytest.raises(ValidationError, match="extra"):
        TokenizerConfig.model_validate({"vocab": 10})


def test_the_mode_defaults_to_reuse_and_to_pinned_when_an_artifact_is_given() -> None:
    sha = "0" * 64
    assert TokenizerConfig().effective_mode is TokenizerMode.REUSE
    assert TokenizerConfig(path="t.json", sha256=sha).effective_mode is TokenizerMode.PINNED
    assert TokenizerConfig(mode="train").effective_mode is TokenizerMode.TRAIN
    assert TokenizerConfig(mode="pinned", path="t.json", sha256=sha).pinned
    with pytest.raises(ValidationError, match="mode pinned needs `path` and `sha256`"):
        TokenizerConfig(mode="pinned")
    with pytest.raises(ValidationError, match="mode train does not take `path`"):
        TokenizerConfig(mode="train", path="t.json", sha256=sha)
    with pytest.raises(ValidationError, match="mode"):
        TokenizerConfig.model_validate({"mode": "keep"})


def test_the_seed_picks_a_different_but_reproducible_training_sample(tmp_path: Path) -> None:
    texts = corpus(60)
    base = {"vocab_size": 500, "sample_fraction": 0.5}
    a = train_tokenizer(texts, TokenizerConfig(seed=1, **base)).to_str()
    again = train_tokenizer(texts, TokenizerConfig(seed=1, **base)).to_str()
    b = train_tokenizer(texts, TokenizerConfig(seed=2, **base)).to_str()
    assert a == again
    assert a != b


def test_a_corpus_above_the_budget_is_sampled_across_the_whole_split() -> None:
    # Two halves of equal size with disjoint identifiers; the budget holds 45% of the corpus.
    early = [f"int alphacounter{i % 5} = betavalue{i % 3};\n" * 20 for i in range(200)]
    late = [f"int omegahandler{i % 5} = zetastate{i % 3};\n" * 20 for i in range(200)]
    texts = early + late
    total = sum(len(t.encode()) for t in texts)
    cfg = TokenizerConfig(vocab_size=400, max_train_bytes=int(total * 0.45))
    assert effective_fraction(cfg, total) == pytest.approx(0.45, abs=0.01)
    assert effective_fraction(cfg, total // 4) == 1.0  # under the budget: everything

    def knows(tok: Tokenizer, word: str) -> bool:
        return len(tok.encode(" " + word).ids) == 1

    cut = train_tokenizer(texts, cfg)  # total unknown: the files that fit the budget first
    sampled = train_tokenizer(texts, cfg, total_bytes=total)
    assert knows(cut, "alphacounter") and not knows(cut, "omegahandler")
    assert knows(sampled, "alphacounter") and knows(sampled, "omegahandler")


def test_a_first_file_larger_than_the_budget_still_trains_the_tokenizer() -> None:
    # One big file first (as `big.hpp` sorts before a checkout's folders), then small ones:
    # the sample used to end at the first file that did not fit, training on nothing.
    big = "".join(f"int widgetcounter{i % 7} = gadgetvalue{i % 5};\n" for i in range(20_000))
    budget = len(big.encode()) // 4
    cfg = TokenizerConfig(vocab_size=400, max_train_bytes=budget)
    sample = list(training_sample([big, *corpus(5)], cfg, 1.0))
    assert len(sample) == 1 and big.startswith(sample[0])  # the budget's worth of the big file
    assert budget - 4 <= len(sample[0].encode()) <= budget
    tok = train_tokenizer([big, *corpus(5)], cfg)
    assert tok.get_vocab_size() > 256 + len(SPECIAL_TOKENS) + len(PLACEHOLDER_TOKENS)
    assert len(tok.encode(" widgetcounter3").ids) <= 3  # it learned the big file's words
    multibyte = "é" * 10  # a cut never splits a character
    assert list(training_sample([multibyte], TokenizerConfig(max_train_bytes=5), 1.0)) == ["éé"]


def test_a_long_training_text_reaches_the_trainer_in_pieces_cut_after_a_line() -> None:
    lines = [f"int value{i} = {i};\n" for i in range(500)]
    text = "".join(lines)
    pieces = list(training_pieces([text], limit=100))
    assert "".join(pieces) == text and len(pieces) > 50  # nothing lost or added, in order
    assert all(len(p) <= 100 and p.endswith("\n") for p in pieces)  # no line split
    assert list(training_pieces(["short"], limit=100)) == ["short"]  # under the limit: whole
    # a line longer than the limit is cut at the limit
    assert list(training_pieces(["x" * 250], limit=100)) == ["x" * 100, "x" * 100, "x" * 50]
