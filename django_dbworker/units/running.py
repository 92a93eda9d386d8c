"""Running a unit where no supervisor does (``run_here``: ``testing``, immediate mode)
and the record of what escaped a unit outside its handler (``fallback``), whatever its
kind."""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar

from django.db import DatabaseError

from ..db import errors
from .failures import FailureInfo, class_path, format_traceback, safe_message
from .protocol import Unit

#: True while ``run_here`` runs a unit: the caller is the user at the keyboard.
_in_caller: ContextVar[bool] = ContextVar("dbworker_in_caller", default=False)


def in_caller() -> bool:
    """Whether the unit runs in its caller (``run_here``), not in a runworkers child.

    There a ``KeyboardInterrupt`` is the user's Ctrl-C: it goes up to the caller, as
    Django's ``ImmediateBackend`` lets it through, and the unit is given back (READY, its
    attempt taken back) without a failure. A child ignores SIGINT, so one raised there is
    the unit's own and is recorded as its failure."""
    return _in_caller.get()


def run_here(c: Unit) -> str:
    """Run a unit in this process as a runworkers child would (``testing.run_until_idle``,
    the backend's immediate mode) and return its outcome: anything but a database error
    that escapes it becomes its FAILED record (a database error is raised: inside the
    caller's transaction nothing more can be written); a ``KeyboardInterrupt`` gives the
    unit back and goes up (``in_caller``)."""
    token = _in_caller.set(True)
    try:
        result = c.run()  # with no one to keep its success, a task records it now
        assert result is not None
        return result.outcome
    except KeyboardInterrupt:
        give_back([c])  # claimable again, its attempt taken back: not its failure
        raise
    except DatabaseError:
        raise
    except Exception as exc:
        return "failed" if fail(c, fallback(c, exc)) else "lease_lost"
    finally:
        _in_caller.reset(token)


def give_back(claimed: Sequence[Unit]) -> None:
    """Give back units claimed here that did not run to their end (a Ctrl-C stopped their
    run): claimable again, their attempts taken back, fenced by their tokens."""
    for c in claimed:
        c.kind.unclaim([c])


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
