"""Signals of row-as-queue units, sent like ``django.tasks``' ``task_started`` and
``task_finished``: in the process that runs the handler (a runworkers child, or the test's
own under ``run_until_idle``), the sender being the ``Worker``.

- ``execution_started``: the unit was claimed and its handler is about to run
  (``execution_id``, ``source_id``, ``attempt``).
- ``execution_finished``: its outcome was recorded: ``outcome`` is ``"finished"`` or
  ``"unfinished"`` (``RunOutcome``), after the commit.
- ``execution_failed``: the handler raised and the failure was recorded: ``error`` (a
  mapping with ``exception_class``, ``message``, ``traceback``), ``will_retry`` (True: it
  is UNFINISHED until its retry, ``@worker(retries=...)``; False: it is FAILED).

A unit whose claim was lost, or whose source row was deleted, sends neither of the last
two. Receivers are called with ``send_robust``: one that raises is logged
(``signal_receiver_failed``) and changes nothing that was recorded.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

from .logs import log_event

#: Sent before a row unit's handler runs: ``execution_id``, ``source_id``, ``attempt``.
execution_started = Signal()
#: Sent after a row unit's outcome was recorded: also ``outcome`` ("finished",
#: "unfinished").
execution_finished = Signal()
#: Sent after a row handler's raise was recorded: also ``error`` (``exception_class``,
#: ``message``, ``traceback``) and ``will_retry``.
execution_failed = Signal()


def send(signal: Signal, sender: Any, **kwargs: Any) -> None:
    """Send ``signal`` robustly: a receiver that raises is logged, never propagated."""
    for receiver, answer in signal.send_robust(sender, **kwargs):
        if isinstance(answer, BaseException):
            log_event(logging.ERROR, "signal_receiver_failed",
                      receiver=getattr(receiver, "__qualname__", repr(receiver)),
                      error=f"{type(answer).__name__}: {answer}")
