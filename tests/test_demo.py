"""The demo's closing tables, from measured runs (the demo itself runs in test_cli)."""

from __future__ import annotations

from collections import Counter

from rich.console import Console

from api.demo import PolicyRun, comparison_table, decisions_table


def _job(created: str, finished: str, state: str = "SUCCEEDED") -> dict[str, str]:
    return {"created_at": created, "finished_at": finished, "state": state}


def _render(table: object) -> str:
    console = Console(record=True, width=100)
    console.print(table)
    return console.export_text()


def test_the_comparison_measures_makespan_and_jct_against_the_first_policy() -> None:
    jigsaw = PolicyRun(
        "jigsaw",
        [
            _job("2026-01-01T00:00:00+00:00", "2026-01-01T00:01:00+00:00"),
            _job("2026-01-01T00:00:00+00:00", "2026-01-01T00:01:20+00:00"),
        ],
        Counter({"lease": 3, "pack": 1}),
    )
    fifo = PolicyRun(
        "fifo",
        [
            _job("2026-01-01T00:10:00+00:00", "2026-01-01T00:11:00+00:00"),
            _job("2026-01-01T00:10:00+00:00", "2026-01-01T00:12:00+00:00", "FAILED"),
        ],
    )
    assert (jigsaw.makespan, fifo.makespan, fifo.failed) == (80.0, 120.0, 1)
    text = _render(comparison_table([jigsaw, fifo]))
    assert "80.0 s" in text and "70.0 s" in text and "1.00x" in text  # jigsaw's row
    assert "120.0 s" in text and "90.0 s" in text and "1.50x" in text and "1/2" in text
    decided = _render(decisions_table(jigsaw))
    assert "what jigsaw decided" in decided and "pack" in decided


def test_a_run_without_ends_has_no_makespan() -> None:
    run = PolicyRun("fifo", [{"created_at": "2026-01-01T00:00:00+00:00", "state": "FAILED"}])
    assert run.makespan is None and run.jcts == []
    assert "-" in _render(comparison_table([run]))
