"""Running a unit where no supervisor does (``run_here``: ``testing``, immediate mode)
and the record of what escaped a unit outside its handler (``fallback``), whatever its
kind."""

from __future__ import annotations

from django.db import DatabaseError

from ..db import errors
from .failures import FailureInfo, class_path, format_traceback, safe_message
from .protocol import Unit


def run_here(c: Unit) -> str:
    """Run a unit in this process as a runworkers child would (``testing.run_until_idle``,
    the backend's immediate mode) and return its outcome: anything but a database error
    that escapes it becomes its FAILED record (a database error is raised: inside the
    caller's transaction nothing more can be written)."""
    try:
        result = c.run()  # with no one to keep its success, a task records it now
        assert result is not None
        return result.outcome
    except DatabaseError:
        raise
    except Exception as exc:
        return "failed" if fail(c, fallback(c, exc)) else "lease_lost"


def fail(c: Unit, info: FailureInfo) -> int:
    """Record ``c`` FAILED for good with ``info`` (its child's last word on it)."""
    return c.fail(info)


def transient(exc: BaseException) -> bool:
    """A database error no unit's value causes, that the same statements may meet no more
    (``db.errors.transient``)."""
    return errors.transient(exc)


def fallback(c: Unit, exc: BaseException) -> FailureInfo:
    """The failure record of a unit that raised ``exc`` outside its handler: running it
    or recording its outcome (``recording`` notes what was being recorded), with the
    real cause and without the offending text."""
    what = getattr(exc, "dbworker_recording", None)
    kind = c.kind.name
    if isinstance(exc, DatabaseError):
        doing = f"recording {what}" if what else "recording its outcome"
        message = (f"the database refused {doing} with {type(exc).__name__}: "
                   f"{safe_message(exc)}; the {kind} is marked FAILED without the "
                   "value it refused (make the value storable: e.g. strip NUL characters) "
                   "instead of being retried as a database error")
    else:
        message = (f"{type(exc).__name__} raised outside the handler, while running or "
                   f"recording this {kind}: {safe_message(exc)}")
    return FailureInfo(class_path(exc), message[:10_000], format_traceback(exc))
