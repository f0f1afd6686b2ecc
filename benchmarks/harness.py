"""Shared pieces of the benchmarks: percentiles and output.

Every benchmark prints a rich table for people and, with `--json`, one JSON object per
line for scripts.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table


def percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def emit(rows: list[dict[str, Any]], title: str, as_json: bool) -> None:
    # Wide enough for a table's columns when the output is a file, not a terminal.
    console = Console(width=None if sys.stdout.isatty() else 200)
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
