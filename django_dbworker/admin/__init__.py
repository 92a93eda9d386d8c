"""The Django admin of django-dbworker: executions, tasks, supervisors and the dashboard,
registered on the default admin site; and ``WorkerStatusMixin`` for your own admins."""

from . import dashboard, executions, pauses, supervisors, tasks  # noqa: F401 - they register
from .mixins import WorkerStatusMixin

__all__ = ["WorkerStatusMixin"]
