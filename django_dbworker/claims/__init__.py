"""Claims: which units may be taken next, and every guarded change of an execution's state."""
