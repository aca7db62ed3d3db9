"""A store writer in its own process, claiming a host name, driven line by line on stdin.

    python -m tests.storage.writer_process ROOT HOST TTL_S [PARTITION]

On start it begins a version of `raw_files/<PARTITION>`, writes one 5-row shard and prints
`began <version>`. Then, one command a line:
  write          another shard                       -> `wrote`
  commit         commit the version                  -> `committed <version>` or `refused <why>`
  clean SKEW_S   clean the partition with a clock SKEW_S seconds ahead -> `cleaned <json list>`
  crash          os._exit(9): no cleanup, no finally, the heartbeat thread dies with it
  exit           leave the version uncommitted and exit normally
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa

from megacpp_pipeline.storage.store import ShardStore, StoreError

SCHEMA = pa.schema([pa.field("path", pa.string()), pa.field("n", pa.int64())])
REPO = Path(__file__).resolve().parents[2]
REPLY_TIMEOUT_S = 60.0


class WriterProcess:
    """The test's side: start a writer process, send it commands, read its one-line replies."""

    def __init__(
        self, root: str, host: str, ttl_s: float, partition: str = "demo", env: dict | None = None
    ) -> None:
        self.host = host
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.storage.writer_process",
                root,
                host,
                str(ttl_s),
                partition,
            ],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.version = self._reply("began")[0]

    def _reply(self, word: str) -> list[str]:
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(REPLY_TIMEOUT_S):
                self.proc.kill()
                raise AssertionError(f"writer {self.host}: no reply {word!r} in time")
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"writer {self.host} exited: {err[-2000:]}")
        reply, *rest = line.rstrip("\n").split(maxsplit=1)
        assert reply == word or (word == "committed" and reply == "refused"), line
        return [reply, *rest] if word == "committed" else rest

    def send(self, command: str, expect: str) -> list[str]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._reply(expect)

    def write(self) -> None:
        self.send("write", "wrote")

    def commit(self) -> tuple[bool, str]:
        """(committed, version or why not)."""
        reply, rest = self.send("commit", "committed")
        return reply == "committed", rest.strip()

    def clean(self, skew_s: float = 0.0) -> list[str]:
        return json.loads(self.send(f"clean {skew_s}", "cleaned")[0])

    def crash(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("crash\n")
        self.proc.stdin.flush()
        assert self.proc.wait(timeout=REPLY_TIMEOUT_S) == 9

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=REPLY_TIMEOUT_S)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def main(argv: list[str]) -> int:
    root, host, ttl = argv[0], argv[1], float(argv[2])
    partition = argv[3] if len(argv) > 3 else "demo"
    skew = [0.0]
    store = ShardStore(
        root,
        max_rows_per_shard=5,
        lease_ttl_s=ttl,
        writer_host=host,
        clock=lambda: datetime.now(UTC) + timedelta(seconds=skew[0]),
    )
    version = store.begin("raw_files", partition, code_version="t")
    shards = 0

    def write() -> None:
        nonlocal shards
        rows = [f"{host}/f{shards}-{i}.cc" for i in range(5)]
        version.table("data", SCHEMA).write(
            pa.table({"path": rows, "n": list(range(5))}, schema=SCHEMA)
        )
        shards += 1

    write()
    print("began", version.manifest.version, flush=True)
    for line in sys.stdin:
        command, *args = line.split()
        if command == "write":
            write()
            print("wrote", flush=True)
        elif command == "commit":
            try:
                manifest = version.commit()
            except StoreError as e:
                print("refused", str(e).replace("\n", " "), flush=True)
            else:
                print("committed", manifest.version, flush=True)
        elif command == "clean":
            skew[0] = float(args[0])
            removed = store.clean_abandoned(store.partition_dir("raw_files", partition))
            skew[0] = 0.0
            print("cleaned", json.dumps(removed), flush=True)
        elif command == "crash":
            os._exit(9)
        elif command == "exit":
            return 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
