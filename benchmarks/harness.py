"""Shared pieces of the benchmarks: a `jigsaw up` server in a subprocess, and output.

Every benchmark prints a rich table for people and, with `--json`, one JSON object per
line for scripts.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from api.credentials import load_credentials


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class RunningServer:
    base_url: str
    token: str


@contextmanager
def jigsaw_server(home: Path, database_url: str | None, *extra: str) -> Iterator[RunningServer]:
    """Run `jigsaw up` on a free port until the block ends."""
    port = free_port()
    env = {**os.environ, "JIGSAW_HOME": str(home)}
    if database_url:
        env["JIGSAW_DATABASE_URL"] = database_url
    proc = subprocess.Popen(
        [sys.executable, "-m", "api.cli", "up", "--port", str(port), *extra],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"jigsaw up exited: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
            try:
                if httpx.get(f"{base_url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("jigsaw up did not become ready in 60 s")
            time.sleep(0.2)
        credentials = load_credentials(home)
        assert credentials is not None, "jigsaw up wrote no credentials"
        yield RunningServer(base_url, credentials.token)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def scratch_postgres(server_url: str) -> Iterator[str]:
    """A fresh PostgreSQL database for one run, dropped afterwards."""
    name = f"jigsaw_bench_{os.getpid()}_{int(time.time())}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def emit(rows: list[dict[str, Any]], title: str, as_json: bool) -> None:
    console = Console()
    if as_json:
        for row in rows:
            console.out(json.dumps(row), highlight=False)
        return
    table = Table(title=title)
    for column in rows[0]:
        table.add_column(column, justify="right" if column != "case" else "left")
    for row in rows:
        table.add_row(*(f"{v:,.2f}" if isinstance(v, float) else str(v) for v in row.values()))
    console.print(table)
