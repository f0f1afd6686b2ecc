"""What the benchmarks print: docs/results/ tables are their `--markdown` output."""

from __future__ import annotations

import argparse
import json

import pytest

from benchmarks.harness import add_output_options, emit

ROWS = [
    {"case": "workload-1 jigsaw", "avg_jct_s": 2127.4, "jct_change": -0.0943, "rounds": 7},
    {"case": "median | all", "avg_jct_s": float("nan"), "jct_change": -0.252, "rounds": 9},
]


def _output(*argv: str) -> str:
    parser = argparse.ArgumentParser()
    add_output_options(parser)
    output: str = parser.parse_args(list(argv)).output
    return output


def test_markdown_is_a_table_of_formatted_cells(capsys: pytest.CaptureFixture[str]) -> None:
    emit(ROWS, "title", "markdown", {"avg_jct_s": "{:,.0f}", "jct_change": "{:+.1%}"})
    assert capsys.readouterr().out.splitlines() == [
        "| case | avg_jct_s | jct_change | rounds |",
        "| --- | ---: | ---: | ---: |",
        "| workload-1 jigsaw | 2,127 | -9.4% | 7 |",
        "| median \\| all |  | -25.2% | 9 |",  # NaN: not measured in that row
        "",
    ]


def test_json_keeps_every_value_unformatted(capsys: pytest.CaptureFixture[str]) -> None:
    emit(ROWS[:1], "title", "json", {"avg_jct_s": "{:,.0f}"})
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == ROWS[:1]


def test_json_is_strict_a_missing_figure_is_null(capsys: pytest.CaptureFixture[str]) -> None:
    emit(ROWS[1:2], "title", "json")
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line, parse_constant=pytest.fail)["avg_jct_s"] is None


def test_the_output_options_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    assert (_output(), _output("--json"), _output("--markdown")) == ("table", "json", "markdown")
    with pytest.raises(SystemExit):
        _output("--json", "--markdown")
    assert "not allowed with argument" in capsys.readouterr().err
