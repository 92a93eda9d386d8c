"""flow_control.py's keyed task (see the package's docstring)."""

from django.tasks import task


@task(concurrency_limit=2, concurrency_key=lambda n: f"key:{n % 50}")
def keyed_noop(n):
    """A no-op limited to 2 running per key, over 50 keys."""
