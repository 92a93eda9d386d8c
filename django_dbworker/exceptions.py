"""Exceptions raised by django-dbworker. Each docstring says how to fix the problem."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from .djtasks import InvalidTask


class DBWorkerError(Exception):
    """Root of every error django-dbworker raises on purpose."""


class InvalidWorker(DBWorkerError, ImproperlyConfigured):
    """A ``@worker(...)`` declaration is wrong; the message names the worker and the fix."""


class UnknownWorker(DBWorkerError, KeyError):
    """No worker with this name is registered.

    Check the spelling, and that the app declaring it is in ``INSTALLED_APPS`` with the
    worker in its ``workers.py`` module.
    """

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class InvalidOutcome(DBWorkerError, TypeError):
    """A handler returned something other than ``Finished()`` or ``Unfinished()``."""


class HandlerTransactionError(DBWorkerError):
    """A transactional handler committed, rolled back or closed the connection itself.

    Transactional workers own their transaction: leave it alone, or declare the worker
    with ``transactional=False`` and manage transactions yourself.
    """


class LeaseLost(DBWorkerError):
    """This process no longer holds the claim: its writes were rolled back, not committed."""


class ChildProcessDied(DBWorkerError):
    """The process running a unit died (killed, crashed, out of memory)."""


class SessionEnded(DBWorkerError):
    """The database session running a unit ended while it ran, and the database answered
    a new connection right after: counted as a crash (``MAX_CRASHES``)."""


class UnknownTask(DBWorkerError):
    """A task row names a function that is not a ``django.tasks`` task of an installed app."""


class InvalidSchedule(DBWorkerError, ValueError):
    """A stored schedule (the admin, ``manage.py dbworker schedules``) has a wrong value.

    ``problems`` maps each wrong field to a message naming the value and the fix; nothing
    was written. Fix those fields and save again.
    """

    def __init__(self, name: object, problems: dict[str, str]) -> None:
        self.name = name
        self.problems = dict(problems)
        details = " ".join(f"{field}: {text}" for field, text in self.problems.items())
        super().__init__(f"Stored schedule {name!r} is invalid. {details}")


class TaskTimeout(DBWorkerError, TimeoutError):
    """A task ran longer than its ``timeout``; its process was stopped."""


class TaskCancelled(DBWorkerError):
    """A task was cancelled with ``django_dbworker.cancel()``."""


class InvalidTaskArguments(DBWorkerError, TypeError):
    """A task's arguments or return value cannot be stored as JSON."""


class ExceptionNotImported(DBWorkerError, ImportError, ValueError):
    """A stored error's ``exception_class_path`` names a class no module imported in this
    process defines: a row's text never causes an import. Compare
    ``exception_class_path`` instead, or import the module that defines the exception
    first. An ``ImportError``, as Django's ``TaskError.exception_class`` raises for a path
    it cannot import; a ``ValueError`` too, as before."""


class TriggerUnavailable(DBWorkerError):
    """A worker's source cannot have database triggers (``dbworker triggers``).

    The message says why: its table lives in another database than our tables, it is a
    view, or it does not exist yet. Without triggers the sweep finds its rows; fix the
    cause, or leave that worker out (``--worker``).
    """


class SnoozeLimitExceeded(DBWorkerError):
    """A task raised ``Snooze`` more often than its ``max_snoozes``: this snooze counts as a
    failed attempt (retried as any other, per ``retries`` and ``retry_for``).

    Raise ``max_snoozes`` in the task's ``@task(...)``, or stop snoozing: fail, or finish
    with what the task can do now.
    """


class InvalidPause(DBWorkerError, ValueError):
    """``pause()`` or ``resume()`` was given something it cannot pause: an unknown queue or
    worker, both or neither, or a reason that is too long. The message names the value and
    the queues or workers there are; nothing was written."""


class TaskFailed(DBWorkerError):
    """``result.get()`` of a task that ended FAILED or CANCELLED: the task's own last error
    (``exception_class_path``, ``message``, ``traceback``; empty for a task cancelled before
    it ran without one) and its ``status``."""

    def __init__(self, message: str, *, result_id: str, status: str,
                 exception_class_path: str = "", error_message: str = "",
                 traceback: str = "") -> None:
        super().__init__(message)
        self.result_id = result_id
        self.status = status
        self.exception_class_path = exception_class_path
        self.message = error_message
        self.traceback = traceback


class ResultTimeout(DBWorkerError, TimeoutError):
    """``result.get(timeout=...)``: the task had not ended in time (it goes on)."""


class HandlerTimeout(DBWorkerError, TimeoutError):
    """A row handler ran longer than its ``@worker(timeout=...)`` and its process was
    stopped (the class path recorded in the execution's failure)."""


class CannotForget(DBWorkerError):
    """``result.forget()`` of a task that runs now, or that other tasks wait for."""


class InvalidDependency(DBWorkerError, InvalidTask):
    """``task.using(after=[...])`` names something a task cannot wait for: not a task
    result or id of this database, a task that does not exist (never enqueued, enqueued
    in another database, or pruned by retention), or a dependency on itself. Give the
    ``TaskResult`` of an ``enqueue()`` of a DBWorkerBackend task (or its id), or
    ``after_row(...)``. Nothing was enqueued."""


class DependencyFailed(DBWorkerError):
    """A task this one waited for (``after=[...]``) ended FAILED or CANCELLED, so this one
    was cancelled without running. Enqueue it with ``run_on_failure=True`` to run it
    whatever its dependencies' outcome."""


class InvalidWorkflow(DBWorkerError, ValueError):
    """A workflow was built wrong (``chain``, ``group``, ``task.step``, ``enqueue(name=...,
    on_complete=...)``, ``enqueue_many(..., workflow=...)``); the message names the item
    and what to give instead. Nothing was enqueued."""


class UnknownWorkflow(DBWorkerError, LookupError):
    """No workflow has this id (``django_dbworker.workflows.get``, ``dbworker workflow``):
    check the id (``dbworker workflows`` lists recent ones)."""
