"""One stack (issue 37): every import of the package points down, at import time and inside
functions (``docs/architecture.md``, "The stack").

Each module has a layer (``LAYERS``, by the longest matching prefix). An import of a module
of a higher layer fails this test unless it is a facade kept on purpose (``FACADES``: a
public object's convenience that reaches up, as Django's ``Task.get_backend()`` does); so
does any circle of imports (facades left out). A facade no longer imported fails too, so
the list stays true. Imports under ``if TYPE_CHECKING:`` are types, not dependencies, and
are not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "django_dbworker"
ROOT = "django_dbworker"

#: The stack, lowest first: module prefix -> layer. The longest prefix wins.
LAYERS: dict[str, int] = {
    # 1. vocabulary
    "exceptions": 1, "conf": 1, "logs": 1, "outcomes": 1, "signals": 1, "context": 1,
    "djtasks": 1,
    "tasks.rates": 1,  # "10/s" parsed: a leaf of words (conf checks TASK_RATE_LIMIT with it)
    # 2. the database layer and the models
    "db": 2, "models": 2,
    # 3. what both kinds of unit share: who claims, failures, the unit protocol, leases
    "units": 3,
    # 4. declarations: no database
    "rows.registry": 4, "tasks.registry": 4, "tasks.task": 4, "tasks.options": 4,
    "tasks.edges": 4, "tasks.schedules": 4, "tasks.arguments": 4, "tasks.retry": 4,
    # 5. stores: each owns one table's guarded UPDATEs
    "rows": 5, "tasks": 5, "workflows.rows": 5,
    "workflows.dependencies": 5, "workflows.retention": 5,
    "pausing": 5,
    # 6. runtimes: claim planners, runners, the unit classes, completions, immediate mode
    "rows.runner": 6, "rows.unit": 6, "rows.chain": 6, "rows.sweep": 6,
    "rows.planner": 6, "tasks.planner": 6,
    "tasks.runner": 6, "tasks.unit": 6, "tasks.completions": 6, "tasks.immediate": 6,
    "tasks.enqueue": 6, "tasks.scheduler": 6,
    # 7. the process model
    "supervisor": 7,
    # 8. surfaces
    "backend": 8, "admin": 8, "cli": 8, "insight": 8, "testing": 8, "pytest_plugin": 8,
    "views": 8, "urls": 8, "workflows": 8, "management": 8, "checks": 8, "apps": 8,
    "": 8,  # django_dbworker/__init__.py: the public API
}

#: Up-pointing imports kept on purpose: (importer, imported) -> why.
FACADES: dict[tuple[str, str], str] = {
    ("djtasks", "tasks.task"): "task_class(): the Task class @task makes under Django's "
                                "own backends (Django-version compatibility)",
    ("tasks.task", "workflows.builder"): "DBWorkerTask.step() and enqueue_many(workflow=): "
                                         "a task's convenience into the workflows API",
    ("rows.registry", "rows.status"): "Worker.state(pk): a worker's convenience",
    ("rows.registry", "rows.store"): "Worker.reset_failed(pk): a worker's convenience",
    ("context", "rows.released"): "Context.released(): a handler's convenience",
    ("tasks.results", "workflows.results"): "TaskResult.dependency_results: a result's "
                                            "convenience into the workflows API",
    ("db.partial", "db.flag_migrations"): "migration 0007 names the operation in db.partial; "
                                          "loaded only when a migration asks (partial's "
                                          "__getattr__), never by a supervisor",
}

def _name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {_name(p): p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts}


def layer(module: str) -> int:
    best = ""
    for prefix in LAYERS:
        if (module == prefix or module.startswith(prefix + ".") or prefix == "") \
                and len(prefix) >= len(best):
            best = prefix
    return LAYERS[best]


def _type_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:``."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                for sub in ast.walk(inner):
                    found.add(id(sub))
    return found


def imports() -> set[tuple[str, str]]:
    """Every (importer, imported) pair of our modules, at any depth, types excepted."""
    known = modules()
    pairs: set[tuple[str, str]] = set()
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        skip = _type_only(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".") if package else []
                    base = base[: len(base) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                elif (node.module or "").startswith(ROOT):
                    module = node.module[len(ROOT) + 1:] if node.module != ROOT else ""
                else:
                    continue
                subs = [f"{module}.{a.name}".lstrip(".") for a in node.names]
                targets = [s for s in subs if s in known] or [module]
            elif isinstance(node, ast.Import):
                targets = [a.name[len(ROOT) + 1:] for a in node.names
                           if a.name.startswith(ROOT + ".")]
            for target in targets:
                if target in known and target != name:
                    pairs.add((name, target))
    return pairs


def up_pointing() -> set[tuple[str, str]]:
    return {(a, b) for a, b in imports() if layer(b) > layer(a)}


def test_every_import_points_down_the_stack() -> None:
    found = up_pointing()
    new = sorted(found - set(FACADES))
    assert not new, (
        "imports that point up the stack (docs/architecture.md, 'The stack'): move the "
        "definition down to where both sides can import it, or list a facade kept on "
        f"purpose in FACADES: {new}")


def test_every_facade_is_still_imported() -> None:
    unused = sorted(set(FACADES) - imports())
    assert not unused, f"no longer imported: remove these from FACADES: {unused}"


def circles() -> list[frozenset[str]]:
    from tests.test_import_cycles import cycles

    graph: dict[str, set[str]] = {}
    for a, b in imports():
        if (a, b) not in FACADES:
            graph.setdefault(a, set()).add(b)
            graph.setdefault(b, set())
    return cycles(graph)


def test_no_circle_of_imports() -> None:
    found = [sorted(c) for c in circles()]
    assert not found, (
        f"circles of imports (a late import too): {found}; move what both sides need "
        "below both")


def test_the_check_fails_on_an_import_pointing_up(tmp_path, monkeypatch) -> None:
    """An import of a surface added to a store fails the test (a copy of the package)."""
    import shutil

    copy = tmp_path / ROOT
    skip = shutil.ignore_patterns("__pycache__", "static", "templates", "migrations")
    shutil.copytree(PACKAGE, copy, ignore=skip)
    store = copy / "tasks" / "store.py"
    store.write_text(store.read_text() + "\n\ndef _up():\n    from ..backend import x\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["PACKAGE"]), "PACKAGE", copy)
    assert ("tasks.store", "backend") in up_pointing()


def test_the_check_fails_on_a_circle(tmp_path, monkeypatch) -> None:
    """A late import that closes a circle inside one layer fails the test (a copy of the
    package): ``db.sources`` imports ``db.keys``; ``db.keys`` importing it back closes it."""
    import shutil

    copy = tmp_path / ROOT
    skip = shutil.ignore_patterns("__pycache__", "static", "templates", "migrations")
    shutil.copytree(PACKAGE, copy, ignore=skip)
    keys = copy / "db" / "keys.py"
    keys.write_text(keys.read_text() + "\n\ndef _back():\n    from . import sources\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["PACKAGE"]), "PACKAGE", copy)
    assert frozenset({"db.keys", "db.sources"}) in circles()
    assert not up_pointing() - set(FACADES)  # same layer: only the circle says it


def test_every_module_has_a_layer_and_the_check_sees_late_imports() -> None:
    found = imports()
    assert ("backend", "tasks.immediate") in found  # inside a method
    assert ("tasks.runner", "tasks.task") in found  # at module level
    assert layer("tasks.runner") == 6 and layer("tasks.store") == 5
    assert layer("supervisor.duties.leases") == 7 and layer("") == 8
