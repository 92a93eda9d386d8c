"""A failure as it is stored, whatever the kind of unit: the exception's class path, a
message that can always be had, a traceback that can always be formatted, every text
storable on every database (``sanitise``)."""

from __future__ import annotations

import contextlib
import traceback as tb
from collections.abc import Iterator
from dataclasses import dataclass

from django.db import DatabaseError


def sanitise(text: str) -> str:
    """``text`` as it may be stored on every database: a NUL character (which PostgreSQL's
    text and jsonb refuse) becomes the four visible characters ``\\x00``."""
    return text.replace("\x00", "\\x00") if "\x00" in text else text


def class_path(exc: BaseException) -> str:
    kind = type(exc)
    return f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', kind.__name__)}"


def safe_message(exc: BaseException) -> str:
    """``str(exc)``, or a description of why it could not be had: an exception whose
    ``__str__`` raises must not stop its own failure from being recorded."""
    try:
        text = str(exc)
        if not isinstance(text, str):
            raise TypeError(f"__str__ returned {type(text).__name__}, not str")
        return text
    except Exception as inner:
        try:
            why = f"{type(inner).__name__}: {inner}"
        except Exception:
            why = type(inner).__name__
        return f"<unprintable {type(exc).__name__}: str() raised {why}>"


def format_traceback(exc: BaseException) -> str:
    """The traceback of ``exc``, formatted without raising whatever its ``str()`` does."""
    try:
        return "".join(tb.format_exception(exc))
    except Exception:
        try:
            return ("".join(tb.format_tb(exc.__traceback__))
                    + f"{class_path(exc)}: {safe_message(exc)}\n")
        except Exception as inner:
            return f"<traceback could not be formatted: {type(inner).__name__}>\n"


@dataclass(frozen=True, slots=True)
class FailureInfo:
    """A failure as it is stored: every text sanitised (``sanitise``) once, here."""

    exception_class: str
    message: str
    traceback: str = ""

    def __post_init__(self) -> None:
        for name in ("exception_class", "message", "traceback"):
            value = getattr(self, name)
            if not isinstance(value, str):
                value = str(value)
            value = sanitise(value)
            if name == "exception_class" and len(value) > 255:  # Failure's column
                value = value[:252] + "..."
            object.__setattr__(self, name, value)

    @classmethod
    def of(cls, exc: BaseException, traceback: str = "") -> FailureInfo:
        return cls(class_path(exc), safe_message(exc), traceback)

    @classmethod
    def caught(cls, exc: BaseException) -> FailureInfo:
        """``of`` with the exception's traceback."""
        return cls.of(exc, format_traceback(exc))


@contextlib.contextmanager
def recording(what: str) -> Iterator[None]:
    """Note on a database error raised inside what is being recorded (shown in the
    fallback failure record the child writes: ``units.fallback``)."""
    try:
        yield
    except DatabaseError as exc:
        if not hasattr(exc, "dbworker_recording"):
            with contextlib.suppress(AttributeError, TypeError):
                exc.dbworker_recording = what  # type: ignore[attr-defined]
        raise


def too_many_crashes(crashed: FailureInfo, max_crashes: int) -> FailureInfo:
    return FailureInfo(
        crashed.exception_class,
        f"{crashed.message}; this unit has now lost its process or its database session "
        f"{max_crashes} time(s) "
        "(DBWORKER['MAX_CRASHES']), so it is marked FAILED instead of being run again.",
        crashed.traceback,
    )
