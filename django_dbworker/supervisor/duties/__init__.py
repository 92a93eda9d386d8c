"""The supervisor's periodic duties, each a small part of one shape (``base.Duty``).

``base``: the shape, the ``Every`` timer and ``Duties``, which runs what is due in order;
``leases``: retries, renewal (run by ``supervisor/renewer.py``, not by ``Duties``),
reaping; ``discovery``: the sweep for rows written without ``save()``; ``tasks``: task
stops, cron, retention; ``outage``: the back-off while the database fails.
docs/architecture.md lists them with their intervals.
"""
