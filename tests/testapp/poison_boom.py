"""A module whose import raises something other than ImportError (tests/test_poison*.py):
a task row naming it must fail that task, never its child."""

raise RuntimeError("poison_boom: this module cannot be imported")
