"""Shared pieces of the benchmarks: a scratch PostgreSQL database, and output.

Every benchmark prints a rich table for people and, with `--json`, one JSON object per
line for scripts.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.table import Table
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url


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
