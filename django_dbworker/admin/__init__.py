"""The Django admin of django-dbworker: executions, tasks, workflows, supervisors, stored
schedules and the dashboard, registered on the default admin site; and
``WorkerStatusMixin`` for your own admins."""

from . import (  # noqa: F401 - they register
    dashboard,
    executions,
    pauses,
    schedules,
    supervisors,
    tasks,
    workflows,
)
from .mixins import WorkerStatusMixin

__all__ = ["WorkerStatusMixin"]
