"""Workflows: tasks that wait for tasks or rows (docs/workflows.md)."""
