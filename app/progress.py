"""Prefill progress for the terminal: one facility (rich's `Progress`) for every command.

`PrefillBar` follows one request's prompt through the engine (`AsyncEngine.
prefill_progress`) and, when that takes longer than `delay_s` and the stream is a terminal,
shows a transient line on stderr:

    prefill ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━ 768/1517 tokens · 96 tok/s · ETA 0:00:08

(`remote prefill` when a prefill peer computes it and its KV streams in). The line is
removed when the first token arrives, so the reply starts where the line was. Nothing is
printed when stderr is not a terminal (a pipe, a log file), or for prefills shorter than
`delay_s` (llama-server logs prefill progress, Ollama and LM Studio show a spinner; a bar that
flashes for 100 ms helps nobody).
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn
from rich.text import Text

from app.engine.types import PrefillProgress

DELAY_S = 1.0  # a prefill shorter than this shows nothing
INTERVAL_S = 0.1  # seconds between two reads of the engine's counters


class _Rate(ProgressColumn):
    """`N tok/s · ETA h:mm:ss` from rich's own speed estimate (its last 30 s of updates)."""

    def render(self, task: Task) -> Text:
        if not task.speed:
            return Text("")
        left = task.time_remaining
        eta = "" if left is None else f" · ETA {int(left) // 3600}:{int(left) % 3600 // 60:02d}:{int(left) % 60:02d}"
        return Text(f"{task.speed:.0f} tok/s{eta}")


def progress_line(stream: TextIO) -> Progress:
    """The one progress display of the CLI: transient, on `stream`."""
    return Progress(
        TextColumn("{task.description}"), BarColumn(),
        TextColumn("{task.completed:.0f}/{task.total:.0f} tokens ·"), _Rate(),
        console=Console(file=stream), transient=True, redirect_stdout=False,
        redirect_stderr=False)  # the reply (run) and the JSON lines (bench) stay on stdout


class PrefillBar:
    """Shows `request_id`'s prefill progress on `stream` (default stderr) while `run()` runs.

    `engine` is an `AsyncEngine` (anything with `prefill_progress(request_id)`). Start it
    with `start()` right after submitting; `await stop()` when the first output arrives
    (before writing it). With `enabled` None, it shows only when `stream` is a terminal.
    """

    def __init__(self, engine: Any, request_id: str, stream: TextIO | None = None,
                 enabled: bool | None = None, delay_s: float = DELAY_S,
                 interval_s: float = INTERVAL_S):
        self.engine = engine
        self.request_id = request_id
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.delay_s = delay_s
        self.interval_s = interval_s
        self._task: asyncio.Task | None = None
        self._progress: Progress | None = None

    def start(self) -> None:
        if self.enabled:
            self._task = asyncio.create_task(self._follow())

    async def stop(self) -> None:
        """Remove the line (if shown) and stop following; idempotent."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    async def _follow(self) -> None:
        t0 = time.perf_counter()
        bar = None
        while True:
            await asyncio.sleep(self.interval_s)
            p: PrefillProgress | None = self.engine.prefill_progress(self.request_id)
            if p is None:  # not admitted yet, or its prompt is done
                if bar is not None:
                    return
                continue
            if bar is None:
                if time.perf_counter() - t0 < self.delay_s:
                    continue
                self._progress = progress_line(self.stream)
                self._progress.start()
                bar = self._progress.add_task(
                    "remote prefill" if p.remote else "prefill", total=p.total,
                    completed=p.computed)
            assert self._progress is not None
            self._progress.update(bar, completed=p.computed,
                                  description="remote prefill" if p.remote else "prefill")


class CellProgress:
    """`bench`'s place in its grid on stderr (a terminal only): `bench ⠋ cell 2 of 3:
    concurrency 4, 16 requests · 0:00:12`, transient. `start(description)` marks the next
    cell begun; `close()` removes the line. With `enabled` None, shown only when `stream`
    is a terminal."""

    def __init__(self, total: int, stream: TextIO | None = None, enabled: bool | None = None):
        from rich.progress import SpinnerColumn, TimeElapsedColumn

        self.stream = stream or sys.stderr
        self.total = total
        self.done = 0
        self._progress = None
        if self.stream.isatty() if enabled is None else enabled:
            self._progress = Progress(TextColumn("bench"), SpinnerColumn(),
                                      TextColumn("{task.description} ·"), TimeElapsedColumn(),
                                      console=Console(file=self.stream), transient=True,
                                      redirect_stdout=False, redirect_stderr=False)
            self._task = self._progress.add_task("", total=total)

    def start(self, description: str) -> None:
        self.done += 1
        if self._progress is not None:
            self._progress.reset(self._task, total=self.total, completed=self.done - 1,
                                 description=f"cell {self.done} of {self.total}: {description}")
            if self.done == 1:  # shown from the first cell on: never a line without one
                self._progress.start()

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
