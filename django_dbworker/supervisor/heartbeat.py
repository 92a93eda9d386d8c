"""The supervisor's row in ``Supervisor``: who runs, where, since when, and what.

One UPDATE per lease renewal (an INSERT the first time), from the renewer thread
(``renewer.py``); the row says ``alive`` while ``heartbeat_expires_at`` (last beat + lease)
is ahead, and ``stopped`` once the supervisor marks it on its way out, after that thread
was joined. A supervisor that dies leaves it to go stale: ``dead``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone

from .. import conf
from ..models import Supervisor
from ..rows.store import Claimant
from . import units

#: Rows of supervisors gone longer than this are deleted when another one starts.
FORGET_AFTER = timedelta(days=7)


class Heartbeat:
    def __init__(self, claimant: Claimant, *, lease: float, concurrency: int,
                 workers: list[str], queues: list[str] | None, tasks: bool,
                 burst: bool) -> None:
        self.claimant = claimant
        self.lease = timedelta(seconds=lease)
        self.started_at = timezone.now()
        self.fields = {
            "host": claimant.host, "pid": claimant.pid, "concurrency": concurrency,
            "workers": workers, "queues": (queues if tasks else []), "burst": burst,
        }
        self._created = False

    def _rows(self) -> Any:
        return Supervisor.objects.using(conf.get().DATABASE)

    def beat(self, children: list[Any], done: int) -> None:
        """Say we are alive and what each busy child runs; one statement. ``children``:
        a copy of the main loop's list (this runs in the renewer thread)."""
        now = timezone.now()
        values = {"last_heartbeat": now, "heartbeat_expires_at": now + self.lease,
                  "running": [described for ch in children for described in running_all(ch)],
                  "units_done": done}
        if self._created and self._rows().filter(pk=self.claimant.supervisor_id).update(
                **values):
            return
        self._rows().filter(last_heartbeat__lt=now - FORGET_AFTER).delete()
        self._rows().update_or_create(
            pk=self.claimant.supervisor_id,
            defaults={**self.fields, **values, "started_at": self.started_at},
        )
        self._created = True

    def stop(self, exit_code: int, done: int) -> None:
        if self._created:
            self._rows().filter(pk=self.claimant.supervisor_id).update(
                stopped_at=timezone.now(), exit_code=exit_code, running=[], units_done=done)


def running_all(child: Any) -> list[dict[str, Any]]:
    """The units a child runs now as JSON (one, or several async units: ``aio``): the
    log fields of each unit, the child and since when; none for a child between units.

    Safe from the renewer thread while the main loop changes the child: it reads the
    numbers the child shares (under their lock) and looks each unit up in ``sent`` (dict
    lookups; nothing the main loop changes is iterated), and a claim is frozen."""
    return [_described(child, c, started) for c, started in child.running_all()]


def _described(child: Any, c: Any, started: float) -> dict[str, Any]:
    since = time.time() - (time.monotonic() - started)
    described = {k: (v if isinstance(v, int | str) else str(v))
                 for k, v in units.describe(c).items()}
    return {**described, "child": child.pid,
            "since": datetime.fromtimestamp(since, UTC).isoformat()}
