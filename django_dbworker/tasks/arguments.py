"""A task's arguments as they are stored: plain JSON values (``plain``: Django's
``normalize_json`` with a fast path for builtin values) and the NUL check PostgreSQL needs
(``has_nul``). Used by enqueue and by the schedules' checks, without a database."""

from __future__ import annotations

from typing import Any

from ..djtasks import normalize_json

_SCALARS = frozenset({str, int, float, bool, type(None)})
_STR = frozenset({str})


def plain(value: Any) -> Any:
    """``normalize_json(value)``, without its per-value ``match`` for what is already plain:
    builtin scalars, lists, tuples and dicts with string keys; anything else (other
    mappings and sequences, bytes, dicts with other keys) goes to ``normalize_json``."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is list or kind is tuple:
        if _SCALARS.issuperset(map(type, value)):  # flat: copied in C
            return list(value)
        return [v if type(v) in _SCALARS else plain(v) for v in value]
    if kind is dict and _STR.issuperset(map(type, value)):
        if _SCALARS.issuperset(map(type, value.values())):
            return dict(value)
        return {k: v if type(v) in _SCALARS else plain(v) for k, v in value.items()}
    return normalize_json(value)


def has_nul(value: Any) -> bool:
    """Whether a NUL character is in any string or dict key of the plain ``value``."""
    kind = type(value)
    if kind is str:
        return "\x00" in value
    if kind is list or kind is tuple:
        return any(has_nul(v) for v in value)
    if kind is dict:
        return any("\x00" in k or has_nul(v) for k, v in value.items())
    return False
