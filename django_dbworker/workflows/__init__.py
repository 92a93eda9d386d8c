"""Workflows: tasks that wait for other tasks (and rows), docs/workflows.md.

``dependencies`` stores a dependent with its edges (``task.using(after=[...])``);
``release`` resolves the edges of a task that ends, in the transaction of its final status.
"""
