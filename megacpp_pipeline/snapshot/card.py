"""The dataset card: README.md at the root of every snapshot, in the Hugging Face dataset-card
format, so the Hub renders it and `datasets.load_dataset(<snapshot dir>)` loads the train
and validation splits with no other argument (the front matter's `configs`). It is written
from the snapshot's own manifest, ledger and documents plus a few stage figures (scrub kinds,
dedup clusters, benchmarks, removals), before promotion, so a snapshot never exists without
one; `megacpp verify` checks the figures in its front matter against the manifest.

The card is outside the manifest's file list (like report/): it describes the training
contract, it is not part of it, and its "changes since" section depends on what was
promoted before.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

from megacpp_pipeline.snapshot import layout
from megacpp_pipeline.snapshot.document_files import read_document_files, read_labelled
from megacpp_pipeline.snapshot.layout import CARD

if TYPE_CHECKING:  # promote writes the card, so the card only names its manifest type
    from megacpp_pipeline.snapshot.layout import SnapshotManifest

_FRONT = re.compile(r"\A---\n(.*?)\n---\n", re.S)
_SPDX_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+-]*")
_OPERATORS = {"AND", "OR", "WITH"}


@dataclass
class CardInputs:
    """What the card says beyond the snapshot's own files (stage figures from the store)."""

    scrub_kinds: Mapping[str, int] = field(default_factory=dict)  # replacements per kind
    dedup: Mapping[str, int] = field(default_factory=dict)  # exact, near, clusters
    benchmarks: Sequence[Mapping[str, Any]] = ()  # id, tasks, files_dropped, files_excised
    removals: Mapping[str, Any] = field(default_factory=dict)  # entries, files, near_remaining
    utilization: float | None = None  # train rows' valid tokens / seq_len
    whole_document_rows: float | None = None  # train rows holding one uncut document
    lengths: Mapping[str, Any] = field(default_factory=dict)  # document length distribution
    checks: Sequence[str] = ()  # the promotion checks that passed
    changes: str | None = None  # markdown: what changed since the previous snapshot


def size_category(n: int) -> str:
    """The Hub's size bucket for a count of documents."""
    for limit, label in (
        (1_000, "n<1K"),
        (10_000, "1K<n<10K"),
        (100_000, "10K<n<100K"),
        (1_000_000, "100K<n<1M"),
        (10_000_000, "1M<n<10M"),
        (100_000_000, "10M<n<100M"),
    ):
        if n < limit:
            return label
    return "n>100M"


def licence_ids(expressions: Sequence[str | None]) -> list[str]:
    """The SPDX ids (and exceptions) that appear in the expressions, lowercased as the Hub
    spells licence identifiers."""
    ids = set()
    for expr in expressions:
        for token in _SPDX_ID.findall(expr or ""):
            if token not in _OPERATORS:
                ids.add(token.lower())
    return sorted(ids)


def figures(manifest: SnapshotManifest) -> dict[str, Any]:
    """The card's machine-checked figures (the `megacpp:` block of the front matter)."""
    return {
        "snapshot_id": manifest.snapshot_id,
        "documents": manifest.documents,
        "document_mode": manifest.document_mode,
        "seq_len": manifest.seq_len,
        "vocab_size": manifest.vocab_size,
        "tokenizer_sha256": str(manifest.tokenizer.get("sha256", "")),
        "splits": {
            name: {"rows": s.rows, "documents": s.documents, "tokens": s.tokens}
            for name, s in manifest.splits.items()
        },
    }


def render_card(snapshot_dir: Path, manifest: SnapshotManifest, inputs: CardInputs) -> str:
    snap = Path(snapshot_dir)
    # only the columns the card counts, low-cardinality strings dictionary-encoded: a few
    # bytes a file, counted by Arrow (no Python object per file)
    present = pq.read_schema(snap / layout.DOCUMENTS).names
    documents = read_labelled(
        snap / layout.DOCUMENTS,
        [c for c in ("source_id", "license_source", "scrub_kinds") if c in present],
        ["source_id", "license_source"],
    )
    files = read_document_files(snap, ["license_expression"], dictionary=True)
    columns = ["source_id", "stage", "status", "reason"]
    ledger = read_labelled(snap / layout.LEDGER, columns, columns)
    expressions = [e for e, _ in counts(files["license_expression"]).items()]
    front = {
        "pretty_name": f"{manifest.name} (C++ training snapshot)",
        "license": licence_ids(expressions) or ["other"],
        "language": ["code"],
        "size_categories": [size_category(manifest.documents)],
        "task_categories": ["text-generation"],
        "tags": ["code", "cpp", "megacpp-pipeline"],
        "configs": [
            {
                "config_name": "default",
                "data_files": [
                    {"split": name, "path": f"{name}/*.parquet"}
                    for name, s in manifest.splits.items()
                    if s.shards
                ],
            }
        ],
        "megacpp": figures(manifest),
    }
    body = [
        f"# {manifest.name}: {manifest.snapshot_id}",
        "",
        f"Packed-row training snapshot of C++ source: {manifest.documents:,} documents in "
        f"rows of exactly {manifest.seq_len:,} tokens, built by megacpp-pipeline from pinned "
        "sources through licence, scrub, dedup, decontamination and quality gates. Every "
        f"collected file is in `{layout.LEDGER}` with where it was kept or dropped and why.",
        *_sources(manifest, documents, ledger),
        *_funnel(manifest, ledger),
        *_licences(documents, files),
        *_scrub(inputs, documents),
        *_dedup(inputs),
        *_exclusions(inputs),
        *_documents(manifest, files, inputs),
        *_tokens(manifest, inputs),
        *_reading(manifest),
        *_checks(inputs),
    ]
    if inputs.changes:
        body += ["", "## Changes since the previous snapshot", "", inputs.changes]
    head = yaml.safe_dump(front, sort_keys=False, allow_unicode=True)
    return f"---\n{head}---\n\n" + "\n".join(body) + "\n"


def counts(column: pa.Array | pa.ChunkedArray) -> Counter[Any]:
    """How often each value occurs (Arrow counts; a value per distinct value comes back)."""
    return Counter({r["values"]: r["counts"] for r in pc.value_counts(column).to_pylist()})


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def _sources(manifest: SnapshotManifest, documents: Any, ledger: Any) -> list[str]:
    docs = counts(documents["source_id"])
    collected = counts(ledger["source_id"])
    rows = [
        (
            sid,
            s.kind,
            f"`{s.revision}`",
            s.declared_license or "",
            collected[sid],
            docs[sid],
            s.weight,
            s.sequences if s.sequences is not None else docs[sid],
        )
        for sid, s in manifest.sources.items()
    ]
    header = (
        "source",
        "kind",
        "pinned revision",
        "declared licence",
        "collected",
        "documents",
        "weight",
        "in the rows",
    )
    return [
        "",
        "## Sources",
        "",
        *_table(header, rows),
        "",
        "A source's weight is how many times each of its documents is packed on average "
        "(0.5: about half of them once; 2.5: each twice and about half three times, by a "
        f"seeded hash of the document, seed {manifest.draw_seed}); `in the rows` counts the "
        f"copies packed, what one epoch over the rows trains on (`draws` in {layout.DOCUMENTS}).",
    ]


def _funnel(manifest: SnapshotManifest, ledger: Any) -> list[str]:
    kept = int(pc.sum(pc.equal(ledger["status"], "kept")).as_py() or 0)
    dropped = ledger.filter(pc.equal(ledger["status"], "dropped"))
    grouped = dropped.group_by(["stage", "reason"]).aggregate([([], "count_all")]).to_pylist()
    by_reason = Counter({(g["stage"], g["reason"]): g["count_all"] for g in grouped})
    order = {s: i for i, s in enumerate(manifest.ledger_stages)}
    rows = sorted(by_reason.items(), key=lambda kv: (order.get(kv[0][0], len(order)), -kv[1]))
    return [
        "",
        "## From collected to kept",
        "",
        f"{ledger.num_rows:,} files collected, {kept:,} kept, {dropped.num_rows:,} dropped:",
        "",
        *_table(("stage", "reason", "files"), [(s, r, n) for (s, r), n in rows]),
    ]


def _licences(documents: Any, files: Any) -> list[str]:
    by_expr = Counter({e or "(none)": n for e, n in counts(files["license_expression"]).items()})
    by_source = counts(documents["license_source"])
    return [
        "",
        "## Licences",
        "",
        "Every file's licence is decided from its own metadata (SPDX line, REUSE, a standard "
        "notice) before the source's declared licence; only allowed files are kept. A "
        "document of many files carries the AND of their expressions.",
        "",
        *_table(("expression", "files"), by_expr.most_common()),
        "",
        *_table(("decided from", "documents"), by_source.most_common()),
    ]


def _documents(manifest: SnapshotManifest, files: Any, inputs: CardInputs) -> list[str]:
    n_files = files.num_rows
    if manifest.document_mode == "file":
        what = (
            f"File mode: each of the {n_files:,} kept files is one document (BOS ... EOS), "
            "FIM within the file."
        )
    else:
        what = (
            f"Repository mode: the {n_files:,} kept files are {manifest.documents:,} documents, "
            "each a source's files (split along directories past a token budget) concatenated "
            "in `#include` order, a file after the files of its document it includes, each "
            "file after a `// <path>` comment line; FIM stays inside one file."
        )
    lines = [
        "",
        "## Documents",
        "",
        what,
        f"`{layout.DOCUMENT_FILES}` lists every file's document, position and token span "
        "(`doc_id, position, source_id, path, content_sha256, license_expression, "
        "start_token, num_tokens`).",
    ]
    if inputs.lengths:
        d = inputs.lengths
        lines += [
            "",
            f"Document length in tokens: median {d.get('p50', 0):,}, p90 {d.get('p90', 0):,}, "
            f"p99 {d.get('p99', 0):,}, max {d.get('max', 0):,}.",
        ]
    if inputs.whole_document_rows is not None:
        lines.append(
            f"Train rows that hold one document end to end: {inputs.whole_document_rows:.1%}."
        )
    return lines


def _scrub(inputs: CardInputs, documents: Any) -> list[str]:
    files = (
        counts(pc.list_flatten(documents["scrub_kinds"]))
        if "scrub_kinds" in documents.column_names
        else Counter()
    )
    rows = [
        (k, inputs.scrub_kinds.get(k, 0), files.get(k, 0))
        for k in sorted(set(inputs.scrub_kinds) | set(files))
    ]
    return [
        "",
        "## What the scrub replaced",
        "",
        "Personal data and secrets are replaced by placeholders (`<EMAIL>`, `<API_KEY>`, ...); "
        "counts per kind, never values.",
        "",
        *(
            _table(("kind", "replacements", "documents"), rows)
            if rows
            else ["Nothing was replaced."]
        ),
    ]


def _dedup(inputs: CardInputs) -> list[str]:
    d = inputs.dedup
    return [
        "",
        "## Duplicates",
        "",
        f"{d.get('exact', 0):,} exact and {d.get('near', 0):,} near duplicates dropped in "
        f"{d.get('clusters', 0):,} clusters (MinHash LSH over C++ tokens); each cluster keeps "
        "one file, an upstream copy before a vendored one.",
    ]


def _exclusions(inputs: CardInputs) -> list[str]:
    out = ["", "## Benchmarks and removal requests", ""]
    if inputs.benchmarks:
        out += _table(
            ("benchmark", "tasks", "files dropped", "files excised"),
            [
                (b["id"], b.get("tasks", ""), b.get("files_dropped", 0), b.get("files_excised", 0))
                for b in inputs.benchmarks
            ],
        )
    else:
        out.append("No benchmark was pinned for decontamination.")
    r = inputs.removals
    out += [
        "",
        f"{r.get('entries', 0)} removal entries; {r.get('files', 0)} files removed on request."
        + (
            f" {r['near_remaining']} near duplicates of removed files remain: they are other "
            "files, which no entry names."
            if r.get("near_remaining")
            else ""
        ),
    ]
    return out


def _tokens(manifest: SnapshotManifest, inputs: CardInputs) -> list[str]:
    t = manifest.tokenizer
    specials = ", ".join(f"`{k}`" for k in sorted(t.get("special_tokens", {})))
    rows = [(name, s.rows, s.documents, s.tokens) for name, s in manifest.splits.items()]
    util = f"{inputs.utilization:.3f}" if inputs.utilization is not None else "n/a"
    return [
        "",
        "## Tokenizer and packing",
        "",
        f"Tokenizer `{layout.TOKENIZER}`: sha256 `{t.get('sha256', '')}`, vocabulary "
        f"{manifest.vocab_size:,}, special tokens {specials}.",
        *_tokenizer_policy(manifest.tokenizer_policy),
        f"Rows of {manifest.seq_len:,} tokens, BOS-aligned best-fit packing; train row "
        f"utilization {util}.",
        "",
        *_table(("split", "rows", "documents", "tokens"), rows),
    ]


def tokenizer_origin(policy: Mapping[str, Any]) -> str:
    """Where a snapshot's tokenizer came from, in words (the card's and the diff's)."""
    decision, mode = policy.get("decision"), policy.get("mode")
    if decision == "reused":
        return f"kept from `{policy.get('from_snapshot')}` (mode {mode})"
    if decision == "pinned":
        return f"pinned (`{policy.get('path')}`)"
    if decision == "trained":
        return f"trained for this snapshot (mode {mode}: {policy.get('reason')})"
    return "not recorded"


def _tokenizer_policy(policy: Mapping[str, Any]) -> list[str]:
    if not policy:
        return []
    line = f"Tokenizer origin: {tokenizer_origin(policy)}."
    if policy.get("decision") == "trained":
        line += (
            " A new vocabulary: a model trained on an earlier snapshot cannot continue on this "
            "one without re-tokenizing."
        )
    return [line]


def _reading(manifest: SnapshotManifest) -> list[str]:
    return [
        "",
        "## How to read it",
        "",
        "```python",
        "from megacpp_pipeline.loader import PackedRowsLoader",
        'loader = PackedRowsLoader("<this folder>", split="train", batch_size=8, seed=0)',
        "",
        "import datasets",
        'ds = datasets.load_dataset("<this folder>")  # train and validation',
        "```",
        "",
        "Megatron: `megacpp export-megatron <this folder> --out PREFIX --split train "
        "validation` writes `.bin`/`.idx` pairs, one sequence per document.",
    ]


def _checks(inputs: CardInputs) -> list[str]:
    if not inputs.checks:
        return []
    return ["", "## What the promotion checks proved", "", *(f"- {c}" for c in inputs.checks)]


def read_front_matter(snapshot_dir: Path) -> dict[str, Any]:
    text = (Path(snapshot_dir) / CARD).read_text(encoding="utf-8")
    m = _FRONT.match(text)
    if m is None:
        raise ValueError(f"{Path(snapshot_dir) / CARD}: no YAML front matter")
    data = yaml.safe_load(m.group(1))
    if not isinstance(data, dict):
        raise ValueError(f"{Path(snapshot_dir) / CARD}: front matter is not a mapping")
    return data


def card_problems(snapshot_dir: Path, manifest: SnapshotManifest) -> list[str]:
    """Where the card disagrees with the manifest (its figures, its data files)."""
    path = Path(snapshot_dir) / CARD
    if not path.is_file():
        return [f"{path}: missing (every snapshot carries its dataset card)"]
    try:
        front = read_front_matter(snapshot_dir)
    except (ValueError, yaml.YAMLError) as e:
        return [str(e)]
    problems = []
    want = figures(manifest)
    got = front.get("megacpp") or {}
    for key, value in want.items():
        if got.get(key) != value:
            problems.append(
                f"{path}: megacpp.{key} is {got.get(key)!r}, the manifest says {value!r}"
            )
    splits = {f["split"] for c in front.get("configs") or [] for f in c.get("data_files") or []}
    listed = {name for name, s in manifest.splits.items() if s.shards}
    if splits != listed:
        problems.append(
            f"{path}: data_files name splits {sorted(splits)}, the manifest {sorted(listed)}"
        )
    return problems
