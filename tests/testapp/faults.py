"""Faults a test injects into a ``runworkers`` supervisor through its environment."""

import os

from django.db import OperationalError
from django.db.backends.signals import connection_created

#: While the file this names exists, the supervisor's lease renewals fail as if the
#: database were unreachable for it alone: its children (forks, other pids) still reach it.
FAIL_RENEWALS = "DBWORKER_TEST_FAIL_RENEWALS"
#: The SET clause of ``store.renew`` and ``taskstore.renew`` (they change nothing else), as
#: PostgreSQL and SQLite quote it and as MariaDB/MySQL do.
RENEWALS = ('SET "lease_expires_at" = %s WHERE', "SET `lease_expires_at` = %s WHERE")


def install() -> None:
    path = os.environ.get(FAIL_RENEWALS)
    if not path:
        return
    supervisor = os.getpid()

    def renewals_fail(execute, sql, params, many, context):
        if (os.getpid() == supervisor and any(r in sql for r in RENEWALS)
                and os.path.exists(path)):
            raise OperationalError("injected by the test: lease renewals fail")
        return execute(sql, params, many, context)

    def wrap(sender, connection, **kwargs):
        if renewals_fail not in connection.execute_wrappers:
            connection.execute_wrappers.append(renewals_fail)

    connection_created.connect(wrap, weak=False)
