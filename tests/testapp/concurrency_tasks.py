"""Tasks with per-key concurrency limits (tests/test_concurrency_keys.py).

Imported by ``tasks.py`` only where ``DBWORKER_TEST_CONCURRENCY`` is set (the supervisors
of the process tests), so the other tests' supervisors keep the plain claim; the in-process
tests import it themselves.
"""

import time

from django_dbworker.djtasks import task


def account_key(account, *args, **kwargs):
    return f"account-{account}"


@task(concurrency_limit=2, concurrency_key=account_key)
def conc_account(account, n, sleep=0.0):
    """Runs at most two at once per account; says when it started and ended."""
    start = time.time()
    time.sleep(sleep)
    return {"account": account, "n": n, "start": start, "end": time.time()}


@task(concurrency_limit=1)
def conc_single(n):
    """One at a time: its key is its path."""
    return n


@task(concurrency_limit=1, concurrency_key="conc-shared")
def conc_shared_one(n):
    return n


@task(concurrency_limit=3, concurrency_key="conc-shared")
def conc_shared_three(n):
    return n


@task(concurrency_limit=2, concurrency_key=account_key, rate_limit="1000/s")
def conc_rated(account, n):
    return n
