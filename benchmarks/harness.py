"""Shared pieces of the benchmarks: percentiles and output.

Every benchmark prints a rich table for people; with `--json`, one JSON object per line
for scripts; with `--markdown`, Markdown tables as they stand in docs/results/.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from rich.console import Console
from rich.table import Table

Output = Literal["table", "json", "markdown"]


def percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def add_output_options(parser: argparse.ArgumentParser) -> None:
    """`--json` or `--markdown` (default: a table for the terminal), read as `args.output`."""
    group = parser.add_mutually_exclusive_group()
    group.set_defaults(output="table")
    group.add_argument(
        "--json", dest="output", action="store_const", const="json", help="one object per line"
    )
    group.add_argument(
        "--markdown",
        dest="output",
        action="store_const",
        const="markdown",
        help="Markdown tables, as in docs/results/",
    )


def emit(
    rows: list[dict[str, Any]],
    title: str,
    output: Output,
    formats: Mapping[str, str] | None = None,
) -> None:
    """`rows` (one dict per row, the same keys) as `output` asks. `formats` gives a
    column's format string (e.g. "{:+.1%}"); a float without one shows two decimals."""
    # Wide enough for a table's columns when the output is a file, not a terminal.
    console = Console(width=None if sys.stdout.isatty() else 200)
    if output == "json":
        for row in rows:
            # Strict JSON: a figure a row does not have (NaN) is null.
            console.out(json.dumps(_json_safe(row), allow_nan=False), highlight=False)
        return
    forms = formats or {}
    cells = [[_cell(value, forms.get(column)) for column, value in row.items()] for row in rows]
    if output == "markdown":
        console.out("\n".join(markdown_table(list(rows[0]), cells)) + "\n", highlight=False)
        return
    table = Table(title=title)
    for column in rows[0]:
        table.add_column(column, justify="right" if column != "case" else "left")
    for row_cells in cells:
        table.add_row(*row_cells)
    console.print(table)


def markdown_table(columns: list[str], cells: list[list[str]]) -> list[str]:
    """A GitHub-flavoured Markdown table: text columns left-aligned, numbers right."""

    def numeric(index: int) -> bool:
        return all(not row[index] or row[index][-1] in "0123456789%x" for row in cells)

    align = ["---:" if numeric(i) else "---" for i in range(len(columns))]
    escaped = [[cell.replace("|", "\\|") for cell in row] for row in cells]
    lines = [" | ".join(columns), " | ".join(align), *(" | ".join(row) for row in escaped)]
    return [f"| {line} |" for line in lines]


def _cell(value: Any, form: str | None) -> str:
    if isinstance(value, float) and math.isnan(value):
        return ""  # not measured in this row (a median row's absolute columns)
    if form is not None:
        return form.format(value)
    if isinstance(value, float):
        return f"{value:,.2f}"
    return str(value)


def _json_safe(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        key: None if isinstance(value, float) and not math.isfinite(value) else value
        for key, value in row.items()
    }
