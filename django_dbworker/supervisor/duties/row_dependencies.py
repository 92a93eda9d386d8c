"""Every ``POLL_INTERVAL``: release the tasks waiting for rows whose execution ended
(``workflows.rows.release_ended_rows``)."""

from __future__ import annotations

from ...workflows.rows import BATCH, release_ended_rows
from .base import Periodic


class RowDependencies(Periodic):
    """Resolve the waiting ``after_row`` edges of ended executions; a full batch is
    followed by the next one at the next round, not an interval later. With no edge on a
    row waiting, each run is one look into an empty range of an index."""

    name = "row_dependencies"

    def __init__(self, interval: float, using: str) -> None:
        super().__init__(interval)
        self.using = using

    def work(self, now: float) -> None:
        if release_ended_rows(self.using) >= BATCH:
            self.every.again()
