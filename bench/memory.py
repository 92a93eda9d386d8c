"""What a process tree holds in memory: RSS, PSS and USS of each process and in total.

- RSS (resident set size, ``VmRSS``) counts every resident page the process maps, also the
  pages it shares with others: a forked child's copy of its parent's heap, until either
  writes it, and the shared libraries. Summed over processes, shared pages count once per
  process.
- PSS (proportional set size) divides each shared page by the number of processes that map
  it: summed over processes, it is what the tree holds.
- USS (unique set size: private clean + private dirty) is what only this process holds: the
  memory its exit would give back.

PSS and USS come from ``/proc/<pid>/smaps_rollup`` (Linux 4.14+), readable for our own
processes. ``python bench/memory.py <pid>`` prints the tree of ``<pid>`` as JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

MB = 1024  # /proc reports kB


def children(pid: int) -> list[int]:
    """The process's direct children (empty once it exited)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def process_memory(pid: int) -> dict[str, float]:
    """RSS, PSS and USS of one process, in MB (zeros once it exited)."""
    kb: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
            key, value = line.split(":", 1)
            kb[key] = int(value.split()[0])
    except OSError:
        pass
    uss = kb.get("Private_Clean", 0) + kb.get("Private_Dirty", 0)
    return {"rss_mb": round(kb.get("Rss", 0) / MB, 1), "pss_mb": round(kb.get("Pss", 0) / MB, 1),
            "uss_mb": round(uss / MB, 1)}


def tree_memory(pid: int) -> dict[str, Any]:
    """RSS, PSS and USS of ``pid`` and its children: each process and the sums (MB)."""
    pids = [pid, *children(pid)]
    each = [{"pid": p, "role": "supervisor" if p == pid else "child", **process_memory(p)}
            for p in pids]
    total = {key: round(sum(e[key] for e in each), 1) for key in ("rss_mb", "pss_mb", "uss_mb")}
    return {"processes": len(pids), **total, "each": each}


if __name__ == "__main__":
    print(json.dumps(tree_memory(int(sys.argv[1])), indent=2))
