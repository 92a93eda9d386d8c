"""Rates as users write them (``"10/s"``, ``"100/5m"``): parsed and bounded once, here.

Used where a rate is declared (``@task(rate_limit=...)``, ``DBWORKER["TASK_RATE_LIMIT"]``)
and where it is enforced (``tasks.ratelimit``).
"""

from __future__ import annotations

import re

RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)?\s*([smhd])\s*$")
RATE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
#: A rate counts at most this many starts per period, over at most a year
#: (``conf.MAX_SECONDS``; tests/test_declarations.py checks they agree).
MAX_RATE_COUNT = 1_000_000_000
MAX_RATE_PERIOD = 365 * 24 * 3600.0


def parse_rate(rate: str) -> tuple[float, float]:
    """``"10/s"`` -> (10 starts, per 1 second); ``"100/5m"`` -> (100, 300)."""
    match = RATE_RE.match(rate) if isinstance(rate, str) else None
    if match:
        count = float(match[1])
        period = float(match[2] or 1) * RATE_UNITS[match[3]]
        if 0 < count <= MAX_RATE_COUNT and 0 < period <= MAX_RATE_PERIOD:
            return count, period
    raise ValueError(
        f"rate {rate!r} is not a rate; write it as COUNT/UNIT, e.g. '10/s', '100/m', "
        "'1000/h' or '5/10s' (a COUNT greater than 0 and at most 1,000,000,000, a period "
        "greater than 0 and at most 365d)."
    )
