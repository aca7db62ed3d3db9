"""What the browser test needs besides Python: Debian's chromium (Playwright cannot download its
own browser on these machines), the launch flags that keep it off the closed network, and a
`dagster dev` started the way `make ui` starts it, stopped with its whole process group."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
INSTALL_SCRIPT = REPO / "scripts" / "install-browser.sh"

# Headless, no sandbox (root in a container), and no background traffic: without the
# networking flags chromium retries Google's hosts on this machine's closed network.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-quic",
]


def find_or_install_chromium() -> tuple[str | None, str]:
    """(path, "") when chromium is usable, else (None, why not)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found, ""
    out = subprocess.run(
        ["sh", str(INSTALL_SCRIPT)], capture_output=True, text=True, timeout=900, check=False
    )
    found = shutil.which("chromium")
    if found:
        return found, ""
    tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]
    return None, f"chromium is not installed and {INSTALL_SCRIPT.name} failed: {tail[0]}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_ui_recipe(dagster_home: Path) -> list[str]:
    """The `make ui` recipe lines as make itself expands them (prerequisites left out)."""
    out = subprocess.run(
        ["make", "-n", "--always-make", "ui", f"DAGSTER_HOME={dagster_home}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    lines = out.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("mkdir -p"))
    return lines[start:]


def listening_addresses(port: int) -> list[str]:
    """Every local address with a socket in LISTEN state on `port` (from /proc/net/tcp*)."""
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        if not Path(table).exists():
            continue
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            addr, hex_port = fields[1].split(":")
            if int(hex_port, 16) != port or fields[3] != "0A":
                continue
            if width == 8:
                found.append(socket.inet_ntop(socket.AF_INET, bytes.fromhex(addr)[::-1]))
            else:
                raw = b"".join(bytes.fromhex(addr[i : i + 8])[::-1] for i in range(0, 32, 8))
                found.append(socket.inet_ntop(socket.AF_INET6, raw))
    return found


@dataclass
class DagsterDev:
    """A running `dagster dev` in its own session, so one killpg stops the webserver, the
    daemon, the code server and every run worker they started."""

    process: subprocess.Popen[bytes]
    url: str
    port: int
    log: Path

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        req = urllib.request.Request(
            f"{self.url}/graphql", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            payload = json.loads(resp.read())
        if payload.get("errors"):
            raise AssertionError(f"GraphQL errors: {payload['errors']}")
        return payload["data"]  # type: ignore[no-any-return]

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM to `dagster dev` (it shuts its children down), then SIGKILL to the whole
        group: whatever is left (a run worker, a code server) goes too."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def start_dagster_dev(command: str, env: dict[str, str], log: Path, port: int) -> DagsterDev:
    argv = shlex.split(command)
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return DagsterDev(process=process, url=f"http://127.0.0.1:{port}", port=port, log=log)


def wait_until_serving(dev: DagsterDev, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if dev.process.poll() is not None:
            raise AssertionError(
                f"dagster dev exited with {dev.process.returncode}:\n{dev.log_tail()}"
            )
        try:
            with urllib.request.urlopen(f"{dev.url}/server_info", timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(2)
    raise AssertionError(f"dagster dev did not answer within {timeout:.0f}s:\n{dev.log_tail()}")
