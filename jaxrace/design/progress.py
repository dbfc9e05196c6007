"""Progress of the loop's stages on the terminal (rich): a bar per stage with counts and an ETA.

Host-side. `Display(quiet=True)` shows nothing; the run's log.txt has a line per stage either way.
"""

from __future__ import annotations

from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class Display:
    """A context manager around one rich `Progress` for the whole run."""

    def __init__(self, quiet: bool = False, console: Console | None = None):
        self.quiet = quiet
        self.console = console or Console(stderr=True)
        self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                  MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("eta"),
                                  TimeRemainingColumn(), console=self.console, disable=quiet)

    def __enter__(self) -> Display:
        self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.stop()

    @contextmanager
    def task(self, description: str, total: int | None):
        """A bar for one step of a stage; yields `advance(n)`. total None: a spinner with elapsed time."""
        task = self._progress.add_task(description, total=total)
        try:
            yield lambda n=1: self._progress.advance(task, n)
        finally:
            self._progress.update(task, completed=total if total is not None else 1, total=total or 1)

    def line(self, text: str) -> None:
        if not self.quiet:
            self._progress.console.print(text, highlight=False)

    def notice(self, text: str) -> None:
        """A line shown even when quiet: something a person must act on (the human judge's URL)."""
        self._progress.console.print(text, highlight=False, style="bold")
