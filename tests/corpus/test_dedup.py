"""Specification of the pre-chunk dedup gate: exact and near duplicates across sources,
one representative per cluster by catalog order then path, and a MinHash that agrees
with datasketch."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from datasketch import MinHash
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from megacpp_pipeline.core.ledger import LEDGER_SCHEMA, DropReason
from megacpp_pipeline.corpus import minhash
from megacpp_pipeline.corpus.dedup import (
    DECISIONS_SCHEMA,
    DedupConfig,
    DedupInputError,
    DedupOrderError,
    band_partitions,
    band_rows,
    bucket_pairs,
    components,
    find_duplicates,
    kept_rows,
    ledger_rows,
    markdown_top_clusters,
    sign_files,
)
from megacpp_pipeline.corpus.dedup.signing import signatures
from tests.fixtures import dedup_labelled, real_cpp

SPAN_HPP = """// Copyright 2021 The Kestrel Authors
// SPDX-License-Identifier: MIT
#ifndef KESTREL_SPAN_HPP
#define KESTREL_SPAN_HPP

#include <cstddef>

namespace kestrel {

/// A view over contiguous elements.
template <typename T>
class span {
 public:
  span(T* data, std::size_t size) : data_(data), size_(size) {}
  T& operator[](std::size_t i) const { return data_[i]; }
  std::size_t size() const { return size_; }
  span subspan(std::size_t offset, std::size_t count) const {
    return span(data_ + offset, count);  // no bounds check in release builds
  }
  T* begin() const { return data_; }
  T* end() const { return data_ + size_; }

 private:
  T* data_;
  std::size_t size_;
};

}  // namespace kestrel
#endif
"""

SPAN_HPP_REINDENTED_AND_RELICENSED = """/*
 * Copyright 2024 Fork Contributors
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef KESTREL_SPAN_HPP
#define KESTREL_SPAN_HPP
#include <cstddef>
namespace kestrel {
template <typename T>
class span
{
public:
    span(T* data, std::size_t size) : data_(data), size_(size) {}
    T& operator[](std::size_t i) const
    {
        return data_[i];
    }
    std::size_t size() const { return size_; }
    span subspan(std::size_t offset, std::size_t count) const
    {
        return span(data_ + offset, count);
    }
    T* begin() const { return data_; }
    T* end() const { return data_ + size_; }
private:
    T* data_;
    std::size_t size_;
};
}
#endif
"""


def table(*rows: tuple[str, str, str]) -> pa.Table:
    return dedup_labelled.scrubbed_table(rows)


def decisions_by_key(result_decisions: pa.Table) -> dict[str, dict[str, object]]:
    return {f"{r['source_id']}:{r['path']}": r for r in result_decisions.to_pylist()}


@pytest.fixture(scope="module")
def labelled() -> list[dedup_labelled.LabelledFile]:
    return dedup_labelled.build(families=8, unrelated=8, seed=11)


def test_exact_copy_in_a_later_source_is_dropped_as_duplicate_of_the_first_source(
    tmp_path: Path,
) -> None:
    shard = table(
        ("app", "src/span.hpp", SPAN_HPP),
        ("vendor", "third_party/kestrel/span.hpp", SPAN_HPP),
    )
    result = find_duplicates([shard], DedupConfig(), tmp_path)
    rows = decisions_by_key(result.decisions)
    assert rows["app:src/span.hpp"]["status"] == "kept"
    copy = rows["vendor:third_party/kestrel/span.hpp"]
    assert copy["status"] == "dropped"
    assert copy["reason"] == DropReason.EXACT_DUPLICATE
    assert copy["dup_of"] == "app:src/span.hpp"
    assert copy["similarity"] == 1.0
    assert copy["cluster_id"] == rows["app:src/span.hpp"]["cluster_id"] == 0
    assert result.stats["dropped_exact_duplicate"] == 1


def test_each_cluster_samples_its_own_dropped_copies_a_vendored_one_listed_first_included(
    tmp_path: Path,
) -> None:
    """A cluster's sample is its dropped copies, never the next clusters' files, nor its kept
    file where a vendored copy comes before it in catalog order (which once failed the run:
    that copy was never named)."""
    util = SPAN_HPP.replace("span", "util")
    fmt = SPAN_HPP.replace("span", "format").replace("Kestrel", "Fmt")
    shard = table(
        ("app", "src/util.cpp", util),
        ("app", "third_party/fmt/format.cc", fmt),
        ("app", "tools/util_copy.cpp", util),
        ("fmtlib", "src/format.cc", fmt),
    )
    vendored = pa.array([False, True, False, False])
    shard = shard.set_column(shard.schema.get_field_index("vendored"), "vendored", vendored)
    result = find_duplicates([shard], DedupConfig(), tmp_path)
    rows = decisions_by_key(result.decisions)
    assert rows["fmtlib:src/format.cc"]["status"] == "kept"
    assert rows["app:third_party/fmt/format.cc"]["dup_of"] == "fmtlib:src/format.cc"
    samples = {c["representative"]: c["members_sample"] for c in result.clusters.to_pylist()}
    assert samples == {
        "app:src/util.cpp": ["app:tools/util_copy.cpp"],
        "fmtlib:src/format.cc": ["app:third_party/fmt/format.cc"],
    }


def test_representative_is_the_earliest_source_in_catalog_order_not_the_smallest_path(
    tmp_path: Path,
) -> None:
    # Stream order is the catalog order: "zlib-fork" comes before "alpha" in this catalog.
    shards = [
        table(("zlib-fork", "z/span.hpp", SPAN_HPP)),
        table(("alpha", "a/span.hpp", SPAN_HPP), ("alpha", "b/span.hpp", SPAN_HPP)),
    ]
    rows = decisions_by_key(find_duplicates(shards, DedupConfig(), tmp_path).decisions)
    assert rows["zlib-fork:z/span.hpp"]["status"] == "kept"
    assert rows["alpha:a/span.hpp"]["dup_of"] == "zlib-fork:z/span.hpp"
    assert rows["alpha:b/span.hpp"]["dup_of"] == "zlib-fork:z/span.hpp"


def test_reindented_relicensed_copy_is_a_near_duplicate_with_similarity_one(
    tmp_path: Path,
) -> None:
    shard = table(
        ("app", "span.hpp", SPAN_HPP), ("fork", "span.hpp", SPAN_HPP_REINDENTED_AND_RELICENSED)
    )
    rows = decisions_by_key(find_duplicates([shard], DedupConfig(), tmp_path).decisions)
    fork = rows["fork:span.hpp"]
    assert fork["reason"] == DropReason.NEAR_DUPLICATE
    assert fork["dup_of"] == "app:span.hpp"
    assert fork["similarity"] == pytest.approx(1.0)


def test_normalized_token_mode_calls_a_reindented_relicensed_copy_exact(tmp_path: Path) -> None:
    shard = table(
        ("app", "span.hpp", SPAN_HPP), ("fork", "span.hpp", SPAN_HPP_REINDENTED_AND_RELICENSED)
    )
    config = DedupConfig(exact_mode="normalized_tokens", near=False)
    rows = decisions_by_key(find_duplicates([shard], config, tmp_path).decisions)
    assert rows["fork:span.hpp"]["reason"] == DropReason.EXACT_DUPLICATE


def test_exact_copy_of_a_near_duplicate_names_the_kept_file_and_stays_exact(
    tmp_path: Path,
) -> None:
    shard = table(
        ("app", "span.hpp", SPAN_HPP),
        ("fork", "span.hpp", SPAN_HPP_REINDENTED_AND_RELICENSED),
        ("mirror", "span.hpp", SPAN_HPP_REINDENTED_AND_RELICENSED),
    )
    result = find_duplicates([shard], DedupConfig(), tmp_path)
    mirror = decisions_by_key(result.decisions)["mirror:span.hpp"]
    assert mirror["reason"] == DropReason.EXACT_DUPLICATE
    assert mirror["dup_of"] == "app:span.hpp"
    assert result.clusters.num_rows == 1
    assert result.clusters["size"][0].as_py() == 3


@pytest.mark.parametrize("scheme", ["one_permutation", "affine64"])
def test_labelled_set_drops_every_copy_at_jaccard_above_08_and_nothing_below_072(
    labelled: list[dedup_labelled.LabelledFile], tmp_path: Path, scheme: str
) -> None:
    result = find_duplicates(
        dedup_labelled.shards(labelled, 20), DedupConfig(scheme=scheme), tmp_path
    )
    originals = {f.family: f"upstream:{f.path}" for f in labelled if f.kind == "original"}
    for f, row in zip(labelled, result.decisions.to_pylist(), strict=True):
        assert (row["source_id"], row["path"]) == (f.source_id, f.path)
        if f.kind in ("original", "unrelated") or f.jaccard <= 0.72:
            assert row["status"] == "kept", (f.kind, f.jaccard, row)
        elif f.jaccard >= 0.8:
            assert row["status"] == "dropped", (f.kind, f.jaccard, row)
            assert row["dup_of"] == originals[f.family]
            assert row["similarity"] == pytest.approx(f.jaccard, abs=0.12)


def test_no_two_kept_files_share_a_content_hash(
    labelled: list[dedup_labelled.LabelledFile], tmp_path: Path
) -> None:
    shards = list(dedup_labelled.shards(labelled, 20))
    result = find_duplicates(shards, DedupConfig(near=False), tmp_path)
    kept = pa.concat_tables(kept_rows(s, result.decisions) for s in shards)
    hashes = kept["content_sha256"].to_pylist()
    assert len(hashes) == len(set(hashes))
    assert kept.num_rows == result.stats["kept"]


def test_decisions_do_not_depend_on_shard_size(
    labelled: list[dedup_labelled.LabelledFile], tmp_path: Path
) -> None:
    small = find_duplicates(dedup_labelled.shards(labelled, 7), DedupConfig(), tmp_path / "a")
    large = find_duplicates(dedup_labelled.shards(labelled, 500), DedupConfig(), tmp_path / "b")
    assert small.decisions.equals(large.decisions)
    assert small.clusters.equals(large.clusters)


@pytest.mark.parametrize("partitions", [2, 7])
def test_candidates_found_per_band_hash_partition_equal_one_query_over_all_bands(
    labelled: list[dedup_labelled.LabelledFile], partitions: int
) -> None:
    """What a run does (a task per partition, merged on the driver) gives exactly the
    pairs, in the same order, as one query over every band row."""
    config = DedupConfig()
    rows, first = [], 0
    for shard in dedup_labelled.shards(labelled, 20):
        sig = signatures(sign_files(shard, config), config.num_perm)
        rank = np.arange(first, first + shard.num_rows, dtype=np.int64)
        bands = band_rows(config, sig, rank)
        assert bands is not None
        rows.append(bands)
        first += shard.num_rows
    bands = pa.concat_tables(rows)
    none = np.empty(0, np.int64)
    u, v = bucket_pairs(bands, none, first)
    assert len(u) > 20  # the copies of every family meet their original
    parts = list(band_partitions(bands, partitions))
    assert len(parts) == partitions and sum(p.num_rows for _, p in parts) == bands.num_rows
    found = [bucket_pairs(p, none, first) for _, p in parts]
    keys = np.unique(np.concatenate([a * first + b for a, b in found]))
    assert np.array_equal(keys, u * first + v)


def test_union_find_keeps_the_lowest_rank_of_every_component() -> None:
    # ranks: 3-7-9 chained, 12-4 apart; 100 is a vendored copy (rank >= n) of doc 0
    u = np.array([7, 9, 12, 100], dtype=np.int64)
    v = np.array([3, 7, 4, 40], dtype=np.int64)
    nodes, reps = components(u, v)
    assert nodes.tolist() == [3, 4, 7, 9, 12, 40, 100]
    assert reps.tolist() == [3, 4, 3, 3, 4, 40, 40]


def test_decisions_do_not_depend_on_how_many_band_partitions(
    labelled: list[dedup_labelled.LabelledFile], tmp_path: Path
) -> None:
    one = find_duplicates(dedup_labelled.shards(labelled, 20), DedupConfig(), tmp_path / "a")
    split = find_duplicates(
        dedup_labelled.shards(labelled, 20), DedupConfig(), tmp_path / "b", partitions=5
    )
    assert one.stats["dropped_near_duplicate"] > 0
    assert split.decisions.equals(one.decisions) and split.stats == one.stats


def test_the_work_folder_is_cleared_a_folder_a_task_leaving_the_driver_no_file(
    labelled: list[dedup_labelled.LabelledFile], tmp_path: Path
) -> None:
    """Every file the tasks write into the work folder lies in a folder that `clear` hands
    to a task of its own (at 64x the driver's removal of them all took 0.56 CPU s); what
    is left for the driver is empty folders, and then nothing."""
    seen: dict[str, Any] = {}

    def clear(task: Callable[..., object], area: Any, folders: Sequence[str]) -> Iterator[None]:
        root = Path(area.root)
        seen["root"], seen["folders"] = root, list(folders)
        seen["before"] = [p for p in root.rglob("*") if p.is_file()]
        for rel in folders:
            task(area, rel)
            yield None
        seen["after"] = [p for p in root.rglob("*") if p.is_file()]

    shards = dedup_labelled.shards(labelled, 20)
    cleared = find_duplicates(shards, DedupConfig(), tmp_path / "a", partitions=3, clear=clear)
    kinds = {p.relative_to(seen["root"]).parts[0] for p in seen["before"]}
    # (shingles too, where the config verifies candidates by their Jaccard)
    assert (
        {"docs", "sig", "exact", "bands"} <= kinds <= {"docs", "sig", "shingles", "exact", "bands"}
    )
    assert len(seen["folders"]) == 3 + 2 * 3
    assert seen["after"] == [] and not seen["root"].exists()
    plain = find_duplicates(
        dedup_labelled.shards(labelled, 20), DedupConfig(), tmp_path / "b", partitions=3
    )
    assert cleared.decisions.equals(plain.decisions) and cleared.stats == plain.stats


def test_verified_candidates_reach_the_same_decisions_on_the_labelled_set(
    labelled: list[dedup_labelled.LabelledFile], tmp_path: Path
) -> None:
    estimated = find_duplicates(dedup_labelled.shards(labelled, 20), DedupConfig(), tmp_path)
    verified = find_duplicates(
        dedup_labelled.shards(labelled, 20), DedupConfig(verify_candidates=True), tmp_path
    )
    assert estimated.decisions["status"].equals(verified.decisions["status"])


def test_stream_out_of_catalog_order_is_refused_naming_the_file(tmp_path: Path) -> None:
    shards = [
        table(("app", "b.hpp", SPAN_HPP)),
        table(("vendor", "a.hpp", SPAN_HPP)),
        table(("app", "c.hpp", SPAN_HPP)),
    ]
    with pytest.raises(DedupOrderError, match=r"app:c\.hpp: source appears again"):
        find_duplicates(shards, DedupConfig(), tmp_path)
    with pytest.raises(DedupOrderError, match=r"app:a\.hpp: paths must increase"):
        find_duplicates(
            [table(("app", "b.hpp", "int b;"), ("app", "a.hpp", "int a;"))], DedupConfig(), tmp_path
        )


def test_bands_that_do_not_fit_the_signature_fail_on_the_field() -> None:
    with pytest.raises(ValidationError, match="bands x rows = 300 exceeds num_perm = 256"):
        DedupConfig(bands=30, rows=10)
    with pytest.raises(ValidationError, match="threshold"):
        DedupConfig(threshold=1.5)


def test_tiny_files_without_a_shingle_still_take_part_in_exact_dedup(tmp_path: Path) -> None:
    shard = table(
        ("a", "x.hpp", "#pragma once\n"),
        ("b", "x.hpp", "#pragma once\n"),
        ("c", "y.hpp", "int y;\n"),
    )
    result = find_duplicates([shard], DedupConfig(), tmp_path)
    assert result.decisions["status"].to_pylist() == ["kept", "dropped", "kept"]
    assert result.stats["empty_signatures"] == 3


def test_empty_stream_gives_empty_decisions(tmp_path: Path) -> None:
    result = find_duplicates([], DedupConfig(), tmp_path)
    assert result.decisions.num_rows == 0
    assert result.decisions.schema == DECISIONS_SCHEMA


def test_ledger_rows_record_reason_dup_of_and_cluster(tmp_path: Path) -> None:
    shard = table(
        ("app", "span.hpp", SPAN_HPP),
        ("fork", "span.hpp", SPAN_HPP_REINDENTED_AND_RELICENSED),
        ("vendor", "span.hpp", SPAN_HPP),
    )
    ledger = ledger_rows(find_duplicates([shard], DedupConfig(), tmp_path).decisions)
    assert ledger.schema == LEDGER_SCHEMA
    rows = ledger.to_pylist()
    assert [r["reason"] for r in rows] == ["near_duplicate", "exact_duplicate"]
    assert {r["stage"] for r in rows} == {""}  # the stage runner stamps it
    assert {r["dup_of"] for r in rows} == {"app:span.hpp"}
    assert rows[0]["detail"].startswith("cluster 0; estimated jaccard ")
    everything = ledger_rows(find_duplicates([shard], DedupConfig(), tmp_path).decisions, True)
    assert everything["status"].to_pylist() == ["kept", "dropped", "dropped"]
    assert everything["detail"][0].as_py() == "representative of cluster 0"


def test_markdown_lists_the_biggest_cluster_first_with_its_paths(
    labelled: list[dedup_labelled.LabelledFile], tmp_path: Path
) -> None:
    extra = [("zz-vendor", f"copy{i}/span.hpp", SPAN_HPP) for i in range(9)]
    shards = [
        *dedup_labelled.shards(labelled, 50),
        table(("zz-app", "span.hpp", SPAN_HPP)),
        table(*extra),
    ]
    result = find_duplicates(shards, DedupConfig(), tmp_path)
    markdown = markdown_top_clusters(
        result.clusters,
        result.stats["dropped_exact_duplicate"],
        result.stats["dropped_near_duplicate"],
        n=3,
    )
    lines = markdown.splitlines()
    assert lines[2].startswith("| cluster | files |")
    assert "| 10 | 9 | 0 | `zz-app:span.hpp` |" in lines[4]
    assert "… and 4 more" in lines[4]
    assert len(lines) == 7


def test_comments_and_whitespace_do_not_change_token_hashes() -> None:
    a = minhash.token_hashes(["int  a=1; // the answer\nreturn a;"])
    b = minhash.token_hashes(["/* header */ int a = 1;\n\n\treturn a ;"])
    c = minhash.token_hashes(["int a = 2; return a;"])
    assert np.array_equal(a.hashes, b.hashes)
    assert not np.array_equal(a.hashes, c.hashes)
    assert len(a.hashes) == 8


_IDENT = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True)
_PUNCT = st.sampled_from(list("{}()[];,.<>=+-*&|!~^%?:#"))
_GAP = st.sampled_from([" ", "\n", "\t", "  ", " /* c */ ", " // c\n", "\n\n    "])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.one_of(_IDENT, _PUNCT), _GAP), min_size=1, max_size=40))
def test_token_hashes_follow_the_tokens_whatever_the_layout(
    pieces: list[tuple[str, str]],
) -> None:
    spaced = "".join(tok + gap for tok, gap in pieces)
    plain = " ".join(tok for tok, _ in pieces)
    assert np.array_equal(
        minhash.token_hashes([spaced]).hashes, minhash.token_hashes([plain]).hashes
    )
    expected = dedup_labelled.reference_tokens(plain)
    assert len(minhash.token_hashes([plain]).hashes) == len(expected)


_SOUP = st.text(alphabet=' \n\tab_9{};/*"é', max_size=300)


def _shingle_reference(tokens: minhash.TokenHashes, k: int) -> np.ndarray:
    """Shingle hashes by their definition, file by file: fold k token hashes, finalize."""
    out = []
    for lo, hi in zip(tokens.offsets[:-1], tokens.offsets[1:], strict=True):
        t = tokens.hashes[lo:hi]
        n = len(t) - k + 1
        if n <= 0:
            continue
        folded = t[:n].copy()
        with np.errstate(over="ignore"):
            for j in range(1, k):
                folded = folded * np.uint64(0x9E3779B97F4A7C15) + t[j : n + j]
        out.append(minhash.fmix64(folded))
    return np.concatenate(out) if out else np.empty(0, np.uint64)


@settings(max_examples=50, deadline=None)
@given(st.lists(_SOUP, max_size=8))
def test_token_and_shingle_hashes_do_not_depend_on_blocks_or_chunks(texts: list[str]) -> None:
    whole = minhash.token_hashes(texts)
    with pytest.MonkeyPatch.context() as mp:
        # Tiny blocks and chunks: files are cut after newlines, shingles straddle chunks.
        mp.setattr(minhash, "TOKEN_BLOCK_BYTES", 16)
        mp.setattr(minhash, "CHUNK", 7)
        cut = minhash.token_hashes(texts)
        shingles = minhash.shingle_hashes(cut, 5)
    assert np.array_equal(whole.hashes, cut.hashes)
    assert np.array_equal(whole.offsets, cut.offsets)
    for i, text in enumerate(texts):
        alone = minhash.token_hashes([text]).hashes
        assert np.array_equal(whole.hashes[whole.offsets[i] : whole.offsets[i + 1]], alone)
    assert np.array_equal(shingles.hashes, _shingle_reference(whole, 5))


def _densify_reference(sig: np.ndarray, seed: int) -> np.ndarray:
    """Densification by its definition, bin by bin: the seeded probes in order, then the
    next non-empty bin to the right, circularly."""
    num_bins = sig.shape[1]
    probes = np.random.RandomState(seed ^ 0x0D15EA5E).randint(0, num_bins, (4, num_bins))
    out = sig.copy()
    for row in range(sig.shape[0]):
        filled = sig[row] != minhash.EMPTY_HASH
        if not filled.any():
            continue
        for j in np.flatnonzero(~filled):
            sequence = [*probes[:, j], *((j + d) % num_bins for d in range(1, num_bins))]
            out[row, j] = sig[row, next(b for b in sequence if filled[b])]
    return out


@pytest.mark.parametrize("num_bins", [16, 100, 256])
def test_one_permutation_signatures_follow_their_definition(
    labelled: list[dedup_labelled.LabelledFile], num_bins: int
) -> None:
    texts = [f.text for f in labelled[:24]] + ["int a = b + c ;", ""]
    shingles = minhash.shingle_hashes(minhash.token_hashes(texts), 5)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(minhash, "CHUNK", 1000)  # files straddle chunks
        ours = minhash.one_permutation_signatures(shingles, num_bins, seed=3)
    # The definition: the top 32 bits scaled to [0, num_bins) pick the bin, each bin keeps
    # its smallest hash, then empty bins are densified.
    seed_mix = minhash.fmix64(np.array([3 + 0x5BD1E995], dtype=np.uint64))[0]
    h = shingles.hashes ^ seed_mix
    bins = ((h >> np.uint64(32)) * np.uint64(num_bins)) >> np.uint64(32)
    rows = np.repeat(np.arange(len(texts)), np.diff(shingles.offsets))
    raw = np.full((len(texts), num_bins), minhash.EMPTY_HASH, dtype=np.uint64)
    np.minimum.at(raw, (rows, bins.astype(np.int64)), h)
    assert np.array_equal(ours, _densify_reference(raw, 3))


def test_affine64_signatures_equal_datasketch_bit_for_bit() -> None:
    shingles = minhash.shingle_hashes(minhash.token_hashes([SPAN_HPP, "int x ;"]), 5)
    a, b = minhash.permutations(256, seed=3)
    ours = minhash.signatures(shingles, a, b)
    theirs = MinHash(num_perm=256, seed=3, scheme="affine64", hashfunc=lambda x: x)
    theirs.update_batch([int(h) for h in shingles.hashes[: shingles.offsets[1]]])
    assert np.array_equal(ours[0], theirs.hashvalues)
    assert np.all(ours[1] == minhash.EMPTY_HASH)  # 3 tokens: no 5-shingle


@pytest.mark.parametrize("scheme", ["one_permutation", "affine64"])
def test_estimated_jaccard_agrees_with_datasketch_affine32_on_labelled_pairs(
    labelled: list[dedup_labelled.LabelledFile], scheme: str
) -> None:
    """datasketch 2.0's default scheme (pinned here: affine32, sha1_hash32 over the
    UTF-8 shingle strings of the reference shingler) is the reference estimator."""
    originals = {f.family: f for f in labelled if f.kind == "original"}
    pairs = [
        (originals[f.family], f)
        for f in labelled
        if f.family in originals and f.kind not in ("original", "exact")
    ]
    texts = [t for pair in pairs for t in (pair[0].text, pair[1].text)]
    shingles = minhash.shingle_hashes(minhash.token_hashes(texts), 5)
    if scheme == "affine64":
        sig = minhash.signatures(shingles, *minhash.permutations(256, seed=1))
    else:
        sig = minhash.one_permutation_signatures(shingles, 256, seed=1)
    ours = minhash.estimated_jaccard(sig[0::2], sig[1::2])
    errors = []
    for (orig, copy), estimate in zip(pairs, ours, strict=True):
        ds = []
        for f in (orig, copy):
            m = MinHash(num_perm=256, seed=1, scheme="affine32")
            m.update_batch([s.encode() for s in dedup_labelled.reference_shingles(f.text)])
            ds.append(m)
        reference = ds[0].jaccard(ds[1])
        j = copy.jaccard
        sigma = math.sqrt(max(j * (1 - j), 1 / 256) / 256)
        # Two independent estimates differ by at most ~4 sigma of their difference.
        assert abs(estimate - reference) <= 4 * math.sqrt(2) * sigma, (copy.kind, j)
        errors.append(estimate - j)
    assert abs(float(np.mean(errors))) < 0.02  # no bias beyond the estimator's noise


def test_vendored_relicensed_copy_of_real_headers_is_found_file_by_file(tmp_path: Path) -> None:
    tree = real_cpp.debian_or_wheel("nlohmann", "pybind11")  # both are vendored everywhere
    upstream = [
        (tree.key, path, content.decode("utf-8"))
        for path, content in sorted(tree.files)  # dedup takes a source's files in path order
        if path.endswith((".hpp", ".h")) and len(content) > 2000
    ]
    assert len(upstream) >= 20, tree.label
    # A vendoring project's copy: its own licence banner on top, tabs instead of spaces.
    banner = "// Vendored into acme-engine. Copyright 2025 Acme. SPDX-License-Identifier: MIT\n"
    vendored = [
        ("vendor", f"third_party/{tree.key}/{path}", banner + text.replace("    ", "\t"))
        for _, path, text in upstream
    ]
    result = find_duplicates([table(*upstream), table(*vendored)], DedupConfig(), tmp_path)
    rows = result.decisions.to_pylist()
    assert [r["status"] for r in rows[: len(upstream)]] == ["kept"] * len(upstream), tree.label
    for (_, path, _), row in zip(upstream, rows[len(upstream) :], strict=True):
        assert row["reason"] == DropReason.NEAR_DUPLICATE, (tree.label, path)
        assert row["dup_of"] == f"{tree.key}:{path}"


def test_shard_without_the_scrubbed_columns_is_refused_naming_them(tmp_path: Path) -> None:
    shard = table(("app", "a.hpp", SPAN_HPP)).drop_columns(["content_sha256"])
    with pytest.raises(DedupInputError, match=r"shard 0: missing columns \['content_sha256'\]"):
        find_duplicates([shard], DedupConfig(), tmp_path)


def test_one_permutation_signature_of_a_small_file_holds_only_its_own_shingle_hashes() -> None:
    # 20 shingles for 256 bins: most bins are empty and must borrow from the file itself.
    text = "int a = b + c * d - e / f ; return g ( h , i ) ;"
    shingles = minhash.shingle_hashes(minhash.token_hashes([text, text]), 5)
    sig = minhash.one_permutation_signatures(shingles, 256, seed=1)
    assert np.array_equal(sig[0], sig[1])
    assert not np.any(sig == minhash.EMPTY_HASH)
    seed_mix = minhash.fmix64(np.array([1 + 0x5BD1E995], dtype=np.uint64))[0]
    own = set((shingles.hashes[: shingles.offsets[1]] ^ seed_mix).tolist())
    assert set(sig[0].tolist()) <= own
