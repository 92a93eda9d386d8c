"""Who claims (``Claimant``) and how a claim's rows are found again (``by_tokens``): the
fence every lease change of both kinds of unit is guarded by."""

from __future__ import annotations

import socket
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Q


@dataclass(frozen=True, slots=True)
class Claimant:
    """Who claims: one supervisor process on one host."""

    supervisor_id: uuid.UUID = field(default_factory=uuid.uuid4)
    host: str = field(default_factory=socket.gethostname)
    pid: int = 0


def by_tokens(claims: list[Any]) -> Q:
    """The rows of ``claims`` (``id``/``token`` of executions or task rows), by token."""
    by_token: dict[uuid.UUID, list[Any]] = {}
    for c in claims:
        by_token.setdefault(c.token, []).append(c.unit_pk)
    owned = Q(pk__in=[])
    for token, pks in by_token.items():
        owned |= Q(token=token, pk__in=pks)
    return owned
