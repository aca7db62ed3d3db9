"""Tokens: a pinned (or deterministically trained) tokenizer artifact, token ids per document
with per-token chunk kinds from one offline alignment, and BOS-aligned best-fit packing into
fixed-length rows with packing telemetry."""

import io
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
from tokenizers import Tokenizer

from assets.partitions import SOURCES
from assets.shell import (
    CODE_VERSION,
    FileCaching,
    accounting_check,
    file_cache,
    gate_code_version,
    manifest_check,
    partition_of,
    run_file_gate,
    summary_metadata,
    upstream_hashes,
)
from megacpp_pipeline.core.schemas import TOKENIZED_DOCS, text_sha256
from megacpp_pipeline.corpus import packing, tokenizer
from megacpp_pipeline.gates import enrich, tokenization
from megacpp_pipeline.snapshot import packed_rows as rows_contract
from megacpp_pipeline.storage.store import Manifest, ShardStore
from resources.pipeline import CatalogResource, ShardStoreResource

DOCUMENTS = pa.schema(
    [
        pa.field("doc_id", pa.int32(), nullable=False),
        pa.field("source_id", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("revision", pa.string(), nullable=False),
        pa.field("blob_sha", pa.string(), nullable=False),
        pa.field("content_sha256", pa.string(), nullable=False),
        pa.field("license_expression", pa.string()),
        pa.field("license_source", pa.string(), nullable=False),
        pa.field("structure_source", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("num_tokens", pa.int32(), nullable=False),  # the document's own tokens
    ],
    metadata={"megacpp.table": "documents", "megacpp.schema_version": "1"},
)


def load_artifact(st: ShardStore) -> tuple[Tokenizer, Manifest]:
    """The tokenizer of the latest `tokenizer` version, its sha256 checked against the
    manifest (a mismatch is a clear error naming the file)."""
    manifest = st.latest("tokenizer", None)
    entry = next(f for f in manifest.files if f.path == "tokenizer.json")
    path = f"{st.version_dir(manifest)}/tokenizer.json"
    return tokenizer.load_tokenizer(st.local_path(path), entry.sha256), manifest


@dg.asset(
    name="tokenizer",
    deps=["deduped_files"],
    group_name="tokens",
    kinds={"huggingface"},
    owners=["team:data"],
    code_version=CODE_VERSION,
    description="The tokenizer artifact: a pinned tokenizer.json (sha256 verified) or a "
    "byte-level BPE trained deterministically on the deduped train split; special tokens "
    "(BOS, EOS, PAD, FIM, scrub placeholders) at fixed ids.",
)
def tokenizer_artifact(
    context: dg.AssetExecutionContext, catalog: CatalogResource, store: ShardStoreResource
) -> dg.MaterializeResult:
    cat = catalog.load()
    cfg = cat.stage_config("tokenizer", tokenizer.TokenizerConfig)
    split_cfg = cat.stage_config("tokenize", tokenization.TokenizeConfig)
    st = store.open()
    deduped = st.latest("deduped_files", None)

    def train_bytes() -> int:
        # `size` (raw bytes) stands in for the text's: close enough to pick a sample fraction
        total = 0
        for name in deduped.data_tables():
            for t in st.iter_tables(deduped, name, columns=["source_id", "path", "size"]):
                splits = tokenization.assign_split(t["source_id"], t["path"], split_cfg)
                train = pc.equal(pa.array(splits, pa.string()), "train")
                total += int(pc.sum(pc.filter(t["size"], train)).as_py() or 0)
        return total

    def train_texts() -> Iterator[str]:
        for name in deduped.data_tables():
            for t in st.iter_tables(deduped, name, columns=["source_id", "path", "text"]):
                splits = tokenization.assign_split(t["source_id"], t["path"], split_cfg)
                for text, split in zip(t["text"].to_pylist(), splits, strict=True):
                    if split == "train":
                        yield text

    total = None if cfg.pinned else train_bytes()
    tok = tokenizer.obtain_tokenizer(cfg, train_texts(), total)
    training = (
        None
        if total is None
        else {
            "train_split_bytes": total,
            "sample_fraction": tokenizer.effective_fraction(cfg, total),
            "max_train_bytes": cfg.max_train_bytes,
        }
    )
    version = st.begin(
        "tokenizer", None, code_version=CODE_VERSION, config=cfg, run_id=context.run_id
    )
    with tempfile.TemporaryDirectory() as tmp:
        info = tokenizer.save_tokenizer(tok, Path(tmp) / "tokenizer.json")
        version.write_file("tokenizer.json", (Path(tmp) / "tokenizer.json").read_bytes())
    manifest = version.commit(
        upstream=upstream_hashes(st, [deduped]),
        extra={"tokenizer": info.model_dump(), "training": training},
    )
    return dg.MaterializeResult(
        metadata={
            "sha256": info.sha256,
            "vocab_size": info.vocab_size,
            "special_tokens": dg.MetadataValue.json(info.special_tokens),
            "pinned": cfg.pinned,
            "training": dg.MetadataValue.json(training or {}),
            "tokenizers_version": info.tokenizers_version,
            "manifest": dg.MetadataValue.path(st.manifest_path(manifest)),
        }
    )


tokenizer_artifact_verifies = manifest_check(
    tokenizer_artifact,
    partitioned=False,
    description="tokenizer.json on disk has the sha256 the manifest records.",
)


@dg.asset(
    partitions_def=SOURCES,
    deps=["enriched_files", tokenizer_artifact],
    group_name="tokens",
    kinds={"parquet"},
    owners=["team:data"],
    code_version=CODE_VERSION,
    description="Token ids per document with a per-token chunk_kind from one offline "
    "char-to-token alignment, and a deterministic train/validation split per document.",
)
def tokenized_docs(
    context: dg.AssetExecutionContext, catalog: CatalogResource, store: ShardStoreResource
) -> dg.MaterializeResult:
    cfg = catalog.load().stage_config("tokenize", tokenization.TokenizeConfig)
    st = store.open()
    tok, tok_manifest = load_artifact(st)
    upstream = st.latest("enriched_files", context.partition_key)
    version = st.begin(
        "tokenized_docs",
        context.partition_key,
        code_version=CODE_VERSION,
        config=cfg,
        run_id=context.run_id,
    )
    stats = run_file_gate(
        st,
        version,
        st.iter_tables(upstream),
        lambda t: tokenization.run(t, tok, cfg),
        TOKENIZED_DOCS,
        caching=FileCaching(
            file_cache(
                store,
                "tokenize",
                tokenization,
                cfg,
                # chunk kinds come from enrich's spans; ids from this exact tokenizer
                salt=gate_code_version(enrich) + tok_manifest.files[0].sha256,
            ),
            "content_sha256",
        ),
        summarize=lambda r: Counter(
            {"tokens_kept": int(pc.sum(r.kept["num_tokens"]).as_py() or 0)}
        ),
        # encode_batch already runs on every core (Rust threads); forked workers would only
        # lose that (tokenizers turns its threads off after a fork) and measured slower
        workers=1,
    )
    manifest = version.commit(upstream=upstream_hashes(st, [upstream, tok_manifest]), stats=stats)
    return dg.MaterializeResult(
        metadata=summary_metadata(
            st,
            manifest,
            tokens=int(stats.get("tokens_kept", 0)),
        )
    )


tokenized_docs_verifies = manifest_check(tokenized_docs, partitioned=True)
tokenized_docs_accounted = accounting_check(tokenized_docs, "enriched_files")


@dg.asset_check(
    asset=tokenized_docs,
    name="every_document_round_trips",
    blocking=True,
    partitions_def=SOURCES,
    description="decode(token_ids) == the enriched text for every document (by sha256).",
)
def every_document_round_trips(
    context: dg.AssetCheckExecutionContext, store: ShardStoreResource
) -> dg.AssetCheckResult:
    st = store.open()
    tok, _ = load_artifact(st)
    partition = partition_of(context)
    manifest = st.latest("tokenized_docs", partition)
    # Compare against the sha256 of the enriched text each row carries (content_sha256), so
    # memory stays one bounded batch of decoded documents, never the whole partition.
    failures: list[str] = []
    checked = 0
    for t in st.iter_tables(manifest, columns=["path", "token_ids", "content_sha256"]):
        for lo in range(0, t.num_rows, 256):
            part = t.slice(lo, 256)
            decoded = tok.decode_batch(part["token_ids"].to_pylist(), skip_special_tokens=False)
            for path, text, sha in zip(
                part["path"].to_pylist(), decoded, part["content_sha256"].to_pylist(), strict=True
            ):
                checked += 1
                if text_sha256(text) != sha:
                    failures.append(path)
    return dg.AssetCheckResult(
        passed=not failures,
        metadata={"documents_checked": checked, "failures": "; ".join(failures[:10]) or "none"},
    )


def _documents(st: ShardStore, manifests: list[Manifest]) -> Iterator[pa.Table]:
    """Every tokenized document in catalog order then path, with its global doc_id."""
    next_id = 0
    for m in manifests:
        for t in st.iter_tables(m):
            ids = pa.array(range(next_id, next_id + t.num_rows), pa.int32())
            next_id += t.num_rows
            yield t.append_column("doc_id", ids)


def _utilization_png(telemetry: packing.PackingTelemetry) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    edges = telemetry.histogram_edges()
    fig, ax = plt.subplots(figsize=(6, 3), dpi=100)
    ax.bar(edges[:-1], telemetry.histogram, width=edges[1] - edges[0], align="edge")
    ax.set_xlabel("row utilization (valid tokens / seq_len)")
    ax.set_ylabel("rows")
    ax.set_title(f"{telemetry.policy}, seq_len {telemetry.seq_len}: {telemetry.utilization:.3f}")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


@dg.asset(
    deps=[tokenized_docs],
    group_name="tokens",
    kinds={"parquet", "numpy"},
    owners=["team:data"],
    code_version=CODE_VERSION,
    description="BOS + tokens + EOS per document, cut into pieces of at most seq_len and "
    "packed best-fit into rows of exactly seq_len tokens (train and validation apart), with "
    "the pieces table that says where every piece of every document sits.",
)
def packed_rows(
    context: dg.AssetExecutionContext, catalog: CatalogResource, store: ShardStoreResource
) -> dg.MaterializeResult:
    cat = catalog.load()
    cfg = cat.stage_config("packing", packing.PackingConfig)
    st = store.open()
    upstream = [st.latest("tokenized_docs", s.id) for s in cat.operational]
    special = tokenizer.special_ids()
    version = st.begin(
        "packed_rows", None, code_version=CODE_VERSION, config=cfg, run_id=context.run_id
    )
    schema = rows_contract.packed_rows_schema(cfg.seq_len)
    documents = version.table("documents", DOCUMENTS)
    pieces = version.table("pieces", rows_contract.PIECES_SCHEMA)
    telemetry: dict[str, packing.PackingTelemetry] = {}
    stats: Counter[str] = Counter()

    def docs() -> Iterator[pa.Table]:
        for t in _documents(st, upstream):
            documents.write(t.select(DOCUMENTS.names))
            stats["documents"] += t.num_rows
            yield t

    for batch in packing.pack(docs(), cfg, special):
        version.table(f"data:{batch.split}", schema).write(batch.rows)
        pieces.write(batch.pieces)
        stats[f"rows:{batch.split}"] += batch.rows.num_rows
        stats["valid_tokens"] += int(pc.sum(batch.rows["valid_token_count"]).as_py() or 0)
        if batch.telemetry is not None:
            prev = telemetry.get(batch.split)
            telemetry[batch.split] = prev.merge(batch.telemetry) if prev else batch.telemetry
    extra: dict[str, object] = {"seq_len": cfg.seq_len, "policy": str(cfg.policy)}
    meta: dict[str, object] = {}
    if telemetry:
        extra["telemetry"] = {k: v.model_dump() for k, v in telemetry.items()}
        if "train" in telemetry:
            png = _utilization_png(telemetry["train"])
            version.write_file("utilization_train.png", png)
            t = telemetry["train"]
            meta.update(
                utilization=round(t.utilization, 4),
                docs_per_row=round(t.docs_per_row, 3),
                avg_doc_tokens=round(t.avg_doc_tokens, 1),
                cropped_doc_frac=round(t.cropped_doc_frac, 4),
            )
    manifest = version.commit(upstream=upstream_hashes(st, upstream), stats=stats, extra=extra)
    if "utilization_train.png" in {f.path for f in manifest.files}:
        png_path = f"{st.version_dir(manifest)}/utilization_train.png"
        meta["utilization_histogram"] = dg.MetadataValue.md(
            f"![row utilization]({png_path})\n\n`{png_path}`"
        )
    return dg.MaterializeResult(
        metadata=summary_metadata(
            st,
            manifest,
            documents=int(stats["documents"]),
            **meta,  # type: ignore[arg-type]
        )
    )


packed_rows_verifies = manifest_check(packed_rows, partitioned=False)


@dg.asset_check(
    asset=packed_rows,
    name="every_row_is_exactly_seq_len",
    blocking=True,
    description="Every row has the seven required columns at exactly seq_len, token ids in "
    "range, and doc_ids consistent with the pieces table.",
)
def every_row_is_exactly_seq_len(store: ShardStoreResource) -> dg.AssetCheckResult:
    st = store.open()
    manifest = st.latest("packed_rows", None)
    tok_manifest = st.latest("tokenizer", None)
    vocab = int(tok_manifest.extra["tokenizer"]["vocab_size"])
    seq_len = int(manifest.extra["seq_len"])
    problems: list[str] = []
    rows = 0
    for name in manifest.data_tables():
        for t in st.iter_tables(manifest, name):
            rows += t.num_rows
            problems.extend(f"{name}: {p}" for p in rows_contract.validate_rows(t, seq_len, vocab))
    return dg.AssetCheckResult(
        passed=not problems and rows > 0,
        metadata={"rows": rows, "seq_len": seq_len, "problems": "; ".join(problems[:5]) or "none"},
    )
