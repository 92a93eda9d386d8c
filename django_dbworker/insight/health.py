"""Is the background work healthy: enough live supervisors, and no queue waiting too long."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from .. import conf
from ..models import Supervisor
from ..rows.registry import workers
from . import counts, horizon
from .snapshot import pauses_since


def verdict() -> dict[str, Any]:
    """``{"healthy": bool, "problems": [...], ...}`` by ``HEALTH_MIN_SUPERVISORS`` and
    ``HEALTH_MAX_LAG``. Only the head of each claim order is read (``counts.worker_lag``,
    ``counts.queue_lags``: one row each through the claim index), never the finished
    history nor a count. A paused queue or worker (``paused``: name to when) is not judged
    by its lag. ``database`` is ``horizon.read()``; a transaction open too long is a
    warning (``warnings``), not a problem: the work still runs, and a probe that failed
    for another program's session would restart the wrong thing."""
    config = conf.get()
    now = timezone.now()
    alive = Supervisor.objects.using(config.DATABASE).alive().count()  # the database's clock
    problems: list[str] = []
    if alive < config.HEALTH_MIN_SUPERVISORS:
        problems.append(f"{alive} supervisor(s) alive; DBWORKER['HEALTH_MIN_SUPERVISORS'] "
                        f"wants at least {config.HEALTH_MIN_SUPERVISORS}")
    lags = {f"worker:{name}": counts.worker_lag(name, now) for name in sorted(workers)}
    lags |= {f"queue:{queue}": lag for queue, lag in sorted(counts.queue_lags(now).items())}
    limit = config.HEALTH_MAX_LAG
    paused = pauses_since()  # waiting there is on purpose: not a problem
    if limit is not None:
        problems += [f"{name} has waited {lag:.0f}s; DBWORKER['HEALTH_MAX_LAG'] is {limit:g}s"
                     for name, lag in lags.items()
                     if lag is not None and lag > limit and name not in paused]
    database = horizon.read(config.DATABASE)
    return {
        "healthy": not problems,
        "problems": problems,
        "warnings": horizon.warnings(database, config.HEALTH_MAX_TRANSACTION_AGE),
        "database": database,
        "supervisors_alive": alive,
        "lag_seconds": {k: None if v is None else round(v, 3) for k, v in lags.items()},
        "max_lag_seconds": limit,
        "paused": {name: at.isoformat() for name, at in sorted(paused.items())},
        "at": now.isoformat(),
    }
