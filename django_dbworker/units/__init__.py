"""What both kinds of unit share, below both: who claims (``claimant``), a failure as it
is stored (``failures``), the unit protocol (``protocol``) and the one lease life cycle
(``leases``). Nothing here knows a row-as-queue execution from a task."""
