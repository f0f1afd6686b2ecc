"""A long command's progress through its steps, on a console that is not stdout (where
`--json` keeps its document): a live bar on a terminal; elsewhere (a pipe, a log, CI) one
line as each step begins, which a live display would not leave behind."""

from __future__ import annotations

import time
from types import TracebackType

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)


class StepProgress:
    """`with StepProgress(err, "digits-cnn", 5) as steps: steps.begin("phase")`."""

    def __init__(self, console: Console, label: str, total: int) -> None:
        self._console = console
        self._label = label
        self._total = total
        self._begun = 0
        self._started = time.monotonic()
        self._bar: Progress | None = None
        if console.is_terminal:
            self._bar = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            )
            self._task = self._bar.add_task(escape(label), total=total)

    def __enter__(self) -> StepProgress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._bar is not None:
            self._bar.stop()

    @property
    def begun(self) -> int:
        """How many steps have begun."""
        return self._begun

    def begin(self, step: str) -> None:
        """Step number `begun + 1` starts; the ones before it are done."""
        text = f"{self._label}: {step}"
        if self._bar is not None:
            self._bar.update(self._task, description=escape(text), completed=self._begun)
        else:
            elapsed = time.monotonic() - self._started
            self._console.print(
                f"[{self._begun + 1}/{self._total}] {text} ({elapsed:.0f} s in)",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
        self._begun += 1
