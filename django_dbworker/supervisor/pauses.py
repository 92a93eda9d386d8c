"""The supervisor's copy of the pauses (``pausing``): the queues and workers it must not
claim from. Read at most once per ``POLL_INTERVAL`` (one indexed read of a small table) and
at once when a change was announced, never per claim."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.utils import timezone

from ..logs import log_event
from ..models import Pause, PauseKind, TaskRecord
from .units import Unit


class Pauses:
    def __init__(self, using: str, interval: float) -> None:
        self.using = using
        self.interval = interval
        self.queues: frozenset[str] = frozenset()
        self.workers: frozenset[str] = frozenset()
        #: Whether tasks wait in a paused queue (read with the pauses): claims of several
        #: queues then go queue by queue instead of walking past them (``TaskWork.claim``).
        self.backlog = False
        self._read_at: float | None = None

    def refresh(self, now: float, *, announced: bool = False) -> bool:
        """Read the pauses again when due or ``announced``; True when something was paused
        that was not before (units claimed ahead of it should go back)."""
        if not announced and self._read_at is not None \
                and now - self._read_at < self.interval:
            return False
        self._read_at = now
        rows = list(Pause.objects.using(self.using).values_list("kind", "name"))
        queues = frozenset(n for k, n in rows if k == PauseKind.QUEUE)
        workers = frozenset(n for k, n in rows if k == PauseKind.WORKER)
        newly = bool(queues - self.queues or workers - self.workers)
        if queues != self.queues or workers != self.workers:
            log_event(logging.INFO, "pauses", queues=",".join(sorted(queues)),
                      workers=",".join(sorted(workers)))
        self.queues, self.workers = queues, workers
        self.backlog = bool(queues) and TaskRecord.objects.using(self.using).ready(
            timezone.now()).in_queues(sorted(queues)).exists()
        return newly

    def holds(self, c: Unit) -> bool:
        """Whether the unit ``c`` belongs to a paused queue or worker."""
        return c.paused(self.queues, self.workers)

    def of(self, claimed: Iterable[Unit]) -> list[Unit]:
        return [c for c in claimed if self.holds(c)]
