"""A module with top-level side effects that nothing imports (tests/test_task_paths.py):
a task row naming its task must fail, never import it. Importing it writes the file named
by DBWORKER_GUARD_SIDE_EFFECT."""

import os
from pathlib import Path

from django_dbworker.djtasks import task

if os.environ.get("DBWORKER_GUARD_SIDE_EFFECT"):
    Path(os.environ["DBWORKER_GUARD_SIDE_EFFECT"]).write_text(f"imported by {os.getpid()}")


@task
def guard_hidden():
    return "ran"
