"""The ``runworkers`` process model: one supervisor, its children, signals and wake-ups."""
