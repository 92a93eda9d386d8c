"""A module of an installed app with top-level side effects, never imported by dbworker.

Importing it writes the file named by ``DBWORKER_TEST_SIDE_EFFECT``: a task row whose
``task_path`` names ``tests.testapp.batch_sideeffect.boom`` must fail without importing it
(tests/test_poison_batch.py)."""

import os
from pathlib import Path

if os.environ.get("DBWORKER_TEST_SIDE_EFFECT"):
    Path(os.environ["DBWORKER_TEST_SIDE_EFFECT"]).write_text(f"imported by {os.getpid()}\n")


def boom():
    raise AssertionError("never called")
