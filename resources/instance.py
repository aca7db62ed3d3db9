"""The local instance's event log: Dagster's SQLite storage, with each database's engine
kept open instead of built and thrown away for every statement.

Why: a run over N sources records one materialization per source per per-source stage.
Stock `SqliteEventLogStorage` creates a SQLAlchemy engine (and so a connection and a cold
statement cache) for every event and fsyncs two databases per event: about 25 ms an event
here, 0.15 s a source for six stages, which made the event log, not the gates, the cost
that grows with the number of sources. Kept engines, and WAL commits that sync at
checkpoints (synchronous=NORMAL), bring it to a few ms (bench/bench_orchestration.py).
It also records one planned-materialization event per stage and run instead of one per
partition (what Dagster's DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS switch does), and
remembers that an optional table or column exists instead of inspecting the schema again
for every event.

Safety: engines are per database file, at most `_MAX_ENGINES` at once (least recently used
ones are disposed), and a forked child drops the parent's without closing them, so no two
processes ever share a SQLite connection. Configured in dagster.yaml; `base_dir` defaults
to DAGSTER_HOME/history/runs, where Dagster's own default storage keeps it.
"""

from __future__ import annotations

import os
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from dagster import Field, StringSource
from dagster._core.storage.event_log.sqlite.sqlite_event_log import (
    SQLITE_BUSY_TIMEOUT_SECONDS,
    SqliteEventLogStorage,
)
from dagster._serdes import ConfigurableClassData
from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import QueuePool

_MAX_ENGINES = 16
_LIVE: weakref.WeakSet[PooledSqliteEventLogStorage] = weakref.WeakSet()


class PooledSqliteEventLogStorage(SqliteEventLogStorage):
    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None) -> None:
        self._engines: OrderedDict[str, Engine] = OrderedDict()
        self._present: set[str] = set()  # tables and asset-key columns known to exist
        super().__init__(base_dir, inst_data)
        _LIVE.add(self)

    @classmethod
    def config_type(cls) -> Any:
        return {"base_dir": Field(StringSource, is_required=False)}

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData | None, config_value: Mapping[str, Any]
    ) -> PooledSqliteEventLogStorage:
        base_dir = config_value.get("base_dir")
        if not base_dir:
            home = os.environ.get("DAGSTER_HOME")
            if not home:
                raise RuntimeError(
                    "PooledSqliteEventLogStorage: set DAGSTER_HOME to the instance's folder "
                    "(or base_dir in dagster.yaml)"
                )
            base_dir = os.path.join(home, "history", "runs")
        return cls(base_dir, inst_data)

    @property
    def supports_partition_subset_in_asset_materialization_planned_events(self) -> bool:
        return True

    def _engine(self, shard: str) -> Engine:
        engine = self._engines.get(shard)
        if engine is not None:
            self._engines.move_to_end(shard)
            return engine
        engine = create_engine(
            self.conn_string_for_shard(shard),
            poolclass=QueuePool,
            pool_size=2,  # schema set-up holds one connection while it opens another
            max_overflow=4,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS, "check_same_thread": False},
        )
        event.listen(engine, "connect", _wal_without_fsync_per_commit)
        self._engines[shard] = engine
        while len(self._engines) > _MAX_ENGINES:
            _, old = self._engines.popitem(last=False)
            old.dispose()
        return engine

    @contextmanager
    def _connect(self, shard: str) -> Iterator[Connection]:
        with self._db_lock:
            engine = self._engine(shard)
            if shard not in self._initialized_dbs:
                self._initdb(engine)
                self._initialized_dbs.add(shard)
            with engine.connect() as conn, conn.begin():
                yield conn

    # Dagster asks on every asset event whether optional tables and columns exist (a fresh
    # engine and a schema inspection each time); a schema only gains them, so a yes is kept.
    def has_table(self, table_name: str) -> bool:
        if table_name in self._present:
            return True
        # not through _connect: this is asked while the index transaction holds its lock
        found = super().has_table(table_name)
        if found:
            self._present.add(table_name)
        return found

    def _has_asset_key_col_on_connection(self, conn: Connection, column_name: str) -> bool:
        key = f"asset_keys.{column_name}"
        if key not in self._present and super()._has_asset_key_col_on_connection(conn, column_name):
            self._present.add(key)
        return key in self._present

    def _forget_after_fork(self) -> None:
        for engine in self._engines.values():
            engine.dispose(close=False)  # the parent's connections stay the parent's
        self._engines.clear()

    def dispose(self) -> None:
        for engine in self._engines.values():
            engine.dispose()
        self._engines.clear()
        super().dispose()


def _wal_without_fsync_per_commit(dbapi_connection: Any, connection_record: Any) -> None:
    # In WAL mode (Dagster sets it when it creates a database) NORMAL syncs at checkpoints,
    # not at every commit: a crash of the process loses nothing, a power cut may lose the
    # last events. Two fsyncs per event (run and index database) were most of its cost.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _after_fork_in_child() -> None:
    for storage in list(_LIVE):
        storage._forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
