"""The checks the registry gives every stage (its version verifies from disk; a per-file
stage accounts for every input file) and the corpus-wide one that stops a run with nothing
left, with the one line that says where every file went."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from megacpp_pipeline.core.schemas import TextLayoutError, text_digests
from megacpp_pipeline.pipeline.context import StageContext
from megacpp_pipeline.pipeline.registry import (
    Check,
    CheckOutcome,
    Markdown,
    Stage,
    module_source,
)
from megacpp_pipeline.storage import slices
from megacpp_pipeline.storage.store import Manifest, ShardStore, StoreError


class CheckFailed(Exception):
    """A blocking check failed; the message names the stage, the check and the problem."""


# at most this many problems travel back from one slice, and are kept for a check
MAX_PROBLEMS = 50


@dataclass(frozen=True)
class RowCheck:
    """A check whose verdict is made row by row: each slice of the version is inspected in a
    task of its own (the run's executor), so rescanning a corpus costs the driver nothing.
    `state` is what every slice needs (a config, an index, a tokenizer): built once by the
    driver, inherited by forked workers or shipped once to Ray; `inspect(state, rows)` gives
    the slice's problems, each naming its file."""

    columns: tuple[str, ...] | None
    inspect: Callable[[Any, pa.Table], list[str]]


@dataclass(frozen=True)
class _RowJob:
    store: ShardStore
    check: RowCheck
    state: Any
    hashed: bool = False  # each row's text hashed against its content_sha256
    # hex sha256 of texts an earlier verified pass inspected (sorted): rows holding one of
    # them are not inspected again
    clean: np.ndarray | None = None
    # per shard of the version (its path in the version), the note of the texts this run's
    # gate inspected when it wrote it (note_gate_scan): the rows it vouched for in a whole
    # shard whose texts hash to it are not inspected again
    notes: Mapping[str, ShardScan] | None = None


@dataclass(frozen=True)
class _Inspected:
    rows: int  # rows inspected
    trusted: int  # rows an earlier verified pass vouched for
    by_gate: int  # rows this run's gate inspected, byte for byte
    problems: list[str]


def _inspect_task(job: _RowJob, pieces: tuple[slices.Piece, ...]) -> _Inspected:
    """The rows inspected, trusted and vouched for by the gate's note, and the first
    problems, of one slice."""
    columns = list(job.check.columns) if job.check.columns else None
    if job.hashed and columns is not None:
        columns += [c for c in ("path", TEXT, CONTENT_HASH) if c not in columns]
    rows = slices.read(job.store, pieces, columns)
    problems: list[str] = []
    trusted = by_gate = 0
    if job.hashed:
        try:
            problems, inspect, noted = _hashed_rows(
                rows, job.clean, _noted_spans(pieces, job.notes)
            )
        except TextLayoutError as e:  # nothing of the slice is trusted or inspected: failed
            where = ", ".join(sorted({p.path for p in pieces}))
            return _Inspected(rows.num_rows, 0, 0, [f"{where}: {e}"])
        by_gate = int((noted & ~inspect).sum())
        trusted = rows.num_rows - int(inspect.sum()) - by_gate
        if trusted or by_gate:
            rows = rows.filter(pa.array(inspect))
    problems += job.check.inspect(job.state, rows)
    return _Inspected(rows.num_rows, trusted, by_gate, problems[:MAX_PROBLEMS])


def _noted_spans(
    pieces: Sequence[slices.Piece], notes: Mapping[str, ShardScan] | None
) -> list[tuple[int, int, ShardScan]]:
    """(first row, end row, note) in the slice of each whole shard a gate's note names."""
    spans: list[tuple[int, int, ShardScan]] = []
    at = 0
    for piece in pieces:
        n = piece.hi - piece.lo
        shard = piece.shard
        note = notes.get(shard.path) if notes and shard is not None else None
        if note is not None and shard is not None and (piece.lo, piece.hi) == (0, shard.rows):
            spans.append((at, at + n, note))
        at += n
    return spans


def _hashed_rows(
    rows: pa.Table,
    clean: np.ndarray | None,
    noted_spans: Sequence[tuple[int, int, ShardScan]] = (),
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Each row's text hashed: a row whose text is not what its content_sha256 says is a
    problem (and inspected), and so is a null text (the schema has none; nothing to
    inspect); which rows to inspect (all but those whose text is in `clean`, and the rows
    a noted span's note vouches for when its texts hash to the note); the rows the notes
    vouched for."""
    texts = rows.column(TEXT)
    actual = text_digests(texts)
    declared = rows.column(CONTENT_HASH).to_pylist()
    lies = np.array([a != d for a, d in zip(actual, declared, strict=True)], dtype=bool)
    paths = rows.column("path").to_pylist()
    problems = [
        f"{paths[i]}: its text does not hash to its {CONTENT_HASH} ({declared[i]})"
        for i in np.flatnonzero(lies).tolist()
    ]
    null = np.zeros(len(actual), dtype=bool)
    if texts.null_count:
        null = np.asarray(texts.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        problems += [f"{paths[i]}: its text is null" for i in np.flatnonzero(null).tolist()]
    inspect = np.ones(len(actual), dtype=bool)
    if clean is not None and len(clean) and len(actual):
        digests = np.array(actual, dtype="S64")
        at = np.minimum(np.searchsorted(clean, digests), len(clean) - 1)
        inspect = clean[at] != digests
    noted = np.zeros(len(actual), dtype=bool)
    for a, b, scan in noted_spans:
        if scan.holds(actual[a:b]):
            noted[a:b] = True
            noted[[a + u for u in scan.unvouched]] = False
    inspect &= ~noted
    inspect |= lies
    inspect &= ~null
    return problems, inspect, noted & ~null


def inspect_rows(
    ctx: StageContext,
    manifest: Manifest,
    check: RowCheck,
    state: Any,
    tables: Sequence[str] | None = None,
) -> tuple[int, list[str]]:
    """(rows inspected, the first problems) of `check` over the version's data tables (or
    `tables`), one task per slice on the run's executor."""
    done = _inspect(ctx, manifest, _RowJob(ctx.store, check, state), tables)
    return done.rows, done.problems


def _inspect(
    ctx: StageContext, manifest: Manifest, job: _RowJob, tables: Sequence[str] | None
) -> _Inspected:
    executor = ctx.executor()
    names = list(tables) if tables is not None else manifest.data_tables()
    inputs = [(manifest, n) for n in names]
    task_bytes = slices.task_bytes_for(
        slices.total_bytes(inputs), executor.workers, ctx.engine.task_bytes
    )
    plan = [s.pieces for s in slices.plan(ctx.store, inputs, task_bytes, cut=False)]
    total = _Inspected(0, 0, 0, [])
    for part in executor.map_light(_inspect_task, job, plan):
        total = _Inspected(
            total.rows + part.rows,
            total.trusted + part.trusted,
            total.by_gate + part.by_gate,
            total.problems + part.problems[: MAX_PROBLEMS - len(total.problems)],
        )
    return total


# --- content checks that stand on an earlier pass --------------------------------------
# A check that reads every text of a version (scrub's detectors, decontamination's index)
# gives the same verdict on the same bytes under the same code and config. Its pass is
# recorded where the orchestrator keeps check results (the Dagster instance's record of
# the check, never the store or the result cache, which anyone who writes shards can
# write): which version, its manifest's sha256, and a fingerprint of what decided. The next
# pass reads nothing again when the version is the one recorded and its objects still hash
# to its manifest; over a new version it inspects only the rows whose text the recorded
# version did not hold byte for byte (by sha256, every row's text hashed each pass).

TEXT = "text"
CONTENT_HASH = "content_sha256"
VERIFIED = "verified"  # the outcome metadata a content check records its pass under


@dataclass(frozen=True)
class Verified:
    """What a content check's pass proved of one partition: the version it read (its folder
    under the store's root), that version's manifest sha256, and the fingerprint of what
    decided the verdict. Every row of that version had its text inspected, or held text a
    verified version before it held byte for byte, or text the stage's gate inspected the
    same way in the process that ran the check (note_gate_scan), and hashed to its
    content_sha256."""

    version: str
    manifest_sha256: str
    fingerprint: str
    run_id: str = ""  # the run that recorded it: shown, never compared

    def as_json(self) -> dict[str, str]:
        return {
            "version": self.version,
            "manifest_sha256": self.manifest_sha256,
            "fingerprint": self.fingerprint,
        }

    @classmethod
    def from_json(cls, data: object, run_id: str = "") -> Verified | None:
        """A record as the orchestrator returns it; None for anything else."""
        if not isinstance(data, Mapping):
            return None
        fields = [data.get(k) for k in ("version", "manifest_sha256", "fingerprint")]
        if not all(isinstance(v, str) and v for v in fields):
            return None
        version, sha, fingerprint = (str(v) for v in fields)
        return cls(version, sha, fingerprint, run_id)

    def same_bytes(self, other: Verified) -> bool:
        return self.as_json() == other.as_json()


def verdict_fingerprint(ctx: StageContext, stage: Stage, check: str, material: str = "") -> str:
    """What decides a content check's verdict: the stage's code version (its code, data
    files, schemas and config, and what it reads), the check's name, this module, and
    `material` (what else the check reads, e.g. the tokenizer's sha256)."""
    h = hashlib.sha256(f"{ctx.code_version(stage)}\0{check}\0{material}\0".encode())
    h.update(module_source(__name__))
    return h.hexdigest()[:32]


@dataclass(frozen=True)
class Rescan:
    """A content check's pass over one partition's version."""

    rows: int  # rows whose text was inspected
    trusted: int  # rows whose text the earlier verified version held byte for byte
    problems: list[str]
    here: Verified  # what this pass proves when it finds no problem
    stood_on: Verified | None  # the recorded pass it relied on, if any
    by_gate: int = 0  # rows whose text this run's gate inspected, byte for byte

    def metadata(self) -> dict[str, Any]:
        stood = self.stood_on
        out: dict[str, Any] = {
            "files_trusted": self.trusted,
            "files_scanned_by_gate": self.by_gate,
            "stood_on": f"{stood.version} (run {stood.run_id[:8] or 'unknown'})"
            if stood is not None
            else "none",
        }
        if not self.problems:
            out[VERIFIED] = self.here.as_json()
        return out


def rescan_content(
    ctx: StageContext,
    stage: Stage,
    check_name: str,
    manifest: Manifest,
    partition: str | None,
    check: RowCheck,
    state: Any,
    *,
    by_text: bool = True,
    material: str = "",
    gate_scans: bool = False,
) -> Rescan:
    """`check` over every row of the version whose text no recorded pass of this check
    (`ctx.prior_verdicts`) vouches for, each row's text hashed against its content_sha256.
    `by_text=False`: a verdict that depends on more of a row than its text (chunk spans,
    token ids) stands only for the very version recorded; otherwise every row is read.
    `material`: what else decides the verdict (goes into the fingerprint). `gate_scans`:
    the stage's gate runs this very inspection over the texts it keeps, so the rows it
    vouched for in a shard whose texts hash to what it noted in this process
    (note_gate_scan) are read and hashed but not inspected again."""
    store = ctx.store
    here = Verified(
        store.relative(store.version_dir(manifest)),
        store.manifest_sha256(manifest),
        verdict_fingerprint(ctx, stage, check_name, material),
    )
    prior = ctx.prior_verdicts.get(partition)
    if not isinstance(prior, Verified) or prior.fingerprint != here.fingerprint:
        prior = None
    if prior is not None and prior.same_bytes(here):
        # the version an earlier pass read: its verdict stands while its objects, and the
        # shards holding its text, still hash to what its manifest records
        problems = store.verify_reused(manifest, ctx.executor().map_light)
        return Rescan(0, 0 if problems else manifest.rows, problems, here, prior)
    clean = _verified_digests(store, prior) if prior is not None and by_text else None
    notes = gate_scan(manifest, here.version, ctx.code_version(stage)) if gate_scans else None
    job = _RowJob(store, check, state, hashed=by_text, clean=clean, notes=notes)
    done = _inspect(ctx, manifest, job, None)
    stood = prior if clean is not None else None
    return Rescan(done.rows, done.trusted, done.problems, here, stood, done.by_gate)


# --- what a gate's own pass inspected, held in this process ------------------------------
# A gate whose pass is its stage's content check (scrub runs its detectors over every text it
# keeps, and again over each text it rewrote) notes the sha256 of each kept text as it
# inspected it (GateResult.scanned_clean). Per shard it writes, the task returns one note
# over those digests with its result; the process that commits the version keeps the notes
# here, in memory: never in the store or the result cache, which anyone who writes shards
# can write, and never for a row served from the cache. The check of that version, run in
# the same process, does not inspect a whole shard whose texts hash to its note: the same
# detectors have already read those very bytes. A shard that does not (tampered, or other
# text than the gate inspected), a version committed by another process or at another code
# version, or a check run on its own: every text inspected, as before.

_GATE_SCANS: dict[tuple[str, str], tuple[str, str, dict[str, ShardScan]]] = {}


@dataclass(frozen=True)
class ShardScan:
    """One shard's note: the sha256 over its texts' hex sha256s in row order, each row the
    gate did not vouch for (`unvouched`, its row in the shard) counted as an empty digest."""

    note: str
    unvouched: tuple[int, ...] = ()

    @classmethod
    def of(cls, digests: Sequence[str | None]) -> ShardScan:
        """The note of a shard whose texts the gate inspected as `digests` (None: a row it
        did not vouch for)."""
        unvouched = tuple(i for i, d in enumerate(digests) if d is None)
        return cls(_joined_sha256([d or "" for d in digests]), unvouched)

    def holds(self, digests: Sequence[str]) -> bool:
        """Whether a whole shard's texts, hashed now (`digests`), are what was noted."""
        if any(u >= len(digests) for u in self.unvouched):
            return False
        kept = list(digests)
        for u in self.unvouched:
            kept[u] = ""
        return _joined_sha256(kept) == self.note


def _joined_sha256(digests: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(digests).encode()).hexdigest()


def note_gate_scan(store: ShardStore, manifest: Manifest, notes: Mapping[str, ShardScan]) -> None:
    """Keep, for the version `manifest` just committed, the notes of the shards its gate
    inspected (shard path in the version -> ShardScan); the partition's earlier notes go."""
    key = (manifest.asset, manifest.partition)
    _GATE_SCANS.pop(key, None)
    if notes:
        version = store.relative(store.version_dir(manifest))
        _GATE_SCANS[key] = (version, manifest.code_version, dict(notes))


def forget_gate_scans() -> None:
    """Drop every note this process holds: its next checks read every text, as a check run
    in another process does."""
    _GATE_SCANS.clear()


def gate_scan(manifest: Manifest, version: str, code_version: str) -> dict[str, ShardScan] | None:
    """The notes this process holds for `version` at `code_version`, if any."""
    held = _GATE_SCANS.get((manifest.asset, manifest.partition))
    if held is None or held[:2] != (version, code_version):
        return None
    return held[2]


def _verified_digests(store: ShardStore, prior: Verified) -> np.ndarray | None:
    """The sorted content hashes of the recorded version's rows, when that version is still
    in the store with the manifest the record names (read and verified shard by shard);
    None when it is not (pruned, or not what was recorded)."""
    vdir = store.join(prior.version)
    try:
        manifest = store.read_manifest(vdir)
        if store.verify_manifest_bytes(vdir) or store.manifest_sha256(manifest) != (
            prior.manifest_sha256
        ):
            return None
        parts = [
            t.column(CONTENT_HASH)
            for name in manifest.data_tables()
            for t in store.iter_tables(manifest, name, columns=[CONTENT_HASH])
        ]
    except (StoreError, KeyError):
        return None
    hexes = [h for part in parts for h in part.to_pylist() if h is not None]
    return np.unique(np.array(hexes, dtype="S64"))


def standard_checks(stage: Stage) -> tuple[Check, ...]:
    """What the registry gives every stage: its version verifies from disk (when it writes
    one), and for a per-file stage, every input file is kept or in its ledger."""
    checks: list[Check] = []
    if stage.manifest_check:
        checks.append(MANIFEST_VERIFIES)
    if stage.gate is not None:
        checks.append(EVERY_INPUT_ACCOUNTED)
    return tuple(checks)


def _manifest_verifies(ctx: StageContext, stage: Stage, partition: str | None) -> CheckOutcome:
    manifest = ctx.store.latest(stage.name, partition)
    executor = ctx.executor()
    problems = ctx.store.verify(manifest, check_sha256=True, mapper=executor.map_light)
    return CheckOutcome(
        passed=not problems,
        metadata={
            "shards_verified": len(manifest.all_shards()),
            "rows": manifest.rows,
            "problems": Markdown("\n".join(f"- {p}" for p in problems[:50]) or "none"),
        },
        description=problems[0] if problems else None,
    )


MANIFEST_VERIFIES = Check(
    "manifest_verifies_from_disk",
    "Every shard listed in the manifest exists on disk with its sha256, row count and schema.",
    _manifest_verifies,
)


def _every_input_accounted(ctx: StageContext, stage: Stage, source: str | None) -> CheckOutcome:
    """The version's own counts add up (in == kept + ledger), and when it consumed the
    latest upstream version, `in` is that version's row count for this source (for a
    corpus-wide gate: for every source)."""
    assert stage.input is not None
    manifest = ctx.store.latest(stage.name, source)
    sources = [source] if source is not None else ctx.sources()
    up_rows = 0
    consumed = True
    for s in sources:
        up = ctx.latest(stage.input, s)
        table = up.tables.get(ctx.input_table(stage, s))
        up_rows += table.rows if table is not None else 0
        key = f"{up.asset}/{up.partition}"
        consumed = consumed and manifest.upstream.get(key) == ctx.store.manifest_sha256(up)
    files_in = int(manifest.stats["input_files"])
    dropped = manifest.tables["ledger"].rows if "ledger" in manifest.tables else 0
    passed = files_in == manifest.rows + dropped and (not consumed or files_in == up_rows)
    where = source or "every source"
    return CheckOutcome(
        passed=passed,
        metadata={"input_files": files_in, "kept": manifest.rows, "dropped": dropped},
        description=None
        if passed
        else f"{where}: {files_in} files in, {manifest.rows} kept + {dropped} in the ledger"
        + ("" if files_in == up_rows or not consumed else f"; {stage.input} holds {up_rows}"),
    )


EVERY_INPUT_ACCOUNTED = Check(
    "every_input_file_kept_or_in_ledger",
    "Every file the input version holds for this source is kept here or in this version's "
    "ledger with a reason (nothing disappears silently).",
    _every_input_accounted,
)


def checks_of(stage: Stage) -> tuple[Check, ...]:
    return standard_checks(stage) + stage.checks


def corpus_funnel(
    ctx: StageContext, upto: str | None = None
) -> tuple[int, list[tuple[str, str, int]]]:
    """Files collected over every source, and the drops of every ledger stage (up to and
    including `upto`) by reason, from the versions' stats alone (no ledger is read)."""
    collected = 0
    drops: list[tuple[str, str, int]] = []
    for name in ctx.registry.ledger_stages():
        stage = ctx.registry.get(name)
        partitions = ctx.partitions(stage)
        counts: Counter[str] = Counter()
        for partition in partitions:
            if not ctx.store.has_version(name, partition):
                continue
            stats = ctx.store.latest(name, partition).stats
            if name == ctx.registry.collection():
                collected += int(stats.get("files_seen", 0))
            counts.update({k: int(v) for k, v in stats.items() if k.startswith("ledger:")})
        drops += [(name, k.removeprefix("ledger:"), n) for k, n in sorted(counts.items()) if n]
        if name == upto:
            break
    return collected, drops


def nothing_left(ctx: StageContext, upto: str) -> str:
    """The one line that says a corpus has nothing left, where it went, and where to read
    the ledgers."""
    collected, drops = corpus_funnel(ctx, upto)
    where = "; ".join(f"{stage}: {n} {reason}" for stage, reason, n in drops) or "none dropped"
    return (
        f"nothing left to promote: none of the {collected} collected files is left after "
        f"{upto} ({where}); every file's reason is in the ledgers under "
        f"{ctx.store.join('assets')}/<stage>/<source>/"
    )


def _some_file_is_left(ctx: StageContext, stage: Stage, partition: str | None) -> CheckOutcome:
    manifest = ctx.store.latest(stage.name, None)
    return CheckOutcome(
        passed=manifest.rows > 0,
        metadata={"files_left": manifest.rows},
        description=None if manifest.rows else nothing_left(ctx, stage.name),
    )


SOME_FILE_IS_LEFT = Check(
    "some_file_is_left",
    "The corpus still holds at least one file; with none, the run stops here with the reason "
    "of every drop instead of training a tokenizer or packing rows on nothing.",
    _some_file_is_left,
)
