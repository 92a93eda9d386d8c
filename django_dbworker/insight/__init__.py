"""What the queues hold now, read-only: shared by the admin dashboard, ``dbworker stats``,
the health view and the metrics. Nothing here changes a row."""
