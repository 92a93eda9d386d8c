"""Counts of what the supervisor's children did, and the progress line shown to people."""

from __future__ import annotations

import time
from collections import Counter
from typing import TextIO

from ..outcomes import RunOutcome


class Progress:
    def __init__(self, stream: TextIO | None, interval: float = 1.0) -> None:
        self.stream = stream
        self.tty = bool(stream and getattr(stream, "isatty", lambda: False)())
        self.interval = interval if self.tty else max(interval, 5.0)
        self.counts: Counter[str] = Counter()
        self.started = time.monotonic()
        self._shown_at = 0.0
        self._shown: tuple[tuple[str, int], ...] = ()  # sorted counts last shown

    def add(self, outcome: str) -> None:
        self.counts[outcome] += 1

    @property
    def done(self) -> int:
        return sum(self.counts.values())

    ORDER = tuple(RunOutcome)

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        shown = [f"{name} {self.counts[name]}" for name in self.ORDER if self.counts[name]]
        detail = f": {', '.join(shown)}" if shown else ""
        return f"{self.done} units{detail} | {self.done / elapsed:.1f}/s"

    def announce(self, text: str) -> None:
        """One line for people (the start-up line), on its own line even on a terminal."""
        if self.stream is None:
            return
        self.stream.write(text + "\n")
        self.stream.flush()

    def show(self, force: bool = False) -> None:
        if self.stream is None:
            return
        now = time.monotonic()
        snapshot = tuple(sorted(self.counts.items()))
        if not force and (now - self._shown_at < self.interval or snapshot == self._shown):
            return
        self._shown_at, self._shown = now, snapshot
        if self.tty:
            self.stream.write("\r\033[K" + self.line())
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.stream is None:
            return
        if self.tty:
            self.stream.write("\r\033[K")
        self.stream.write(self.line() + "\n")
        self.stream.flush()
