"""StepProgress: a live bar on a terminal, one plain line per step elsewhere."""

from __future__ import annotations

import io

from rich.console import Console

from api.progress import StepProgress


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    sink = io.StringIO()
    return Console(file=sink, force_terminal=terminal, width=100), sink


def test_off_a_terminal_each_step_is_one_line_as_it_begins() -> None:
    console, sink = _console(terminal=False)
    with StepProgress(console, "job [x]", 3) as steps:
        steps.begin("first")
        assert sink.getvalue().startswith("[1/3] job [x]: first (")
        steps.begin("second")
        assert steps.begun == 2
    lines = sink.getvalue().splitlines()
    assert [line.split(" (")[0] for line in lines] == [
        "[1/3] job [x]: first",
        "[2/3] job [x]: second",
    ]
    assert "\x1b[" not in sink.getvalue()


def test_on_a_terminal_a_live_bar_shows_the_step_and_leaves_nothing_behind() -> None:
    console, sink = _console(terminal=True)
    with StepProgress(console, "job [x]", 3) as steps:
        steps.begin("first")
        steps.begin("second")
        console.file.flush()
    shown = sink.getvalue()
    # The markup-looking label is shown as written; the bar counts the steps done.
    assert "job [x]: second" in shown and "1/3" in shown
    assert "[1/3]" not in shown  # no plain lines
