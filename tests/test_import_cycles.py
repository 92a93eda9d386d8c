"""No import cycles among the package's modules (issue #17).

The graph is made of the imports a module runs when it is imported: those at module level,
not the ones inside functions (a deliberate late import, which is how a store reaches a
runner without a cycle) nor those under ``if TYPE_CHECKING:``. A ``from . import x`` of a
submodule is an edge to that submodule only. A new cycle fails this test with the modules on it;
a cycle kept on purpose goes in ``ALLOWED`` with the reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "django_dbworker"

#: Cycles kept on purpose: frozenset of module names -> why. None today.
ALLOWED: dict[frozenset[str], str] = {}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts}


def _top_level(tree: ast.Module) -> list[ast.stmt]:
    """Statements run at import: the module's, and those inside top-level ``if``/``try``
    blocks, except ``if TYPE_CHECKING:``."""
    out: list[ast.stmt] = []
    pending = list(tree.body)
    while pending:
        node = pending.pop(0)
        if isinstance(node, ast.If):
            if "TYPE_CHECKING" in ast.unparse(node.test):
                pending += node.orelse
                continue
            pending += node.body + node.orelse
        elif isinstance(node, ast.Try):
            pending += node.body + node.orelse + node.finalbody
            for handler in node.handlers:
                pending += handler.body
        else:
            out.append(node)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _top_level(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                # ``from package import submodule`` needs the submodule (the package is
                # being imported already); any other name needs the module itself.
                subs = [f"{module}.{alias.name}" for alias in node.names]
                targets = [sub for sub in subs if sub in modules]
                if len(targets) < len(subs):
                    targets.append(module)
            for target in targets:
                if target in modules and target != name:
                    graph[name].add(target)
                # importing a.b.c runs a and a.b first
                parent = target.rpartition(".")[0]
                while parent and parent != name and not name.startswith(parent + "."):
                    if parent in modules:
                        graph[name].add(parent)
                    parent = parent.rpartition(".")[0]
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_package_has_no_import_cycle() -> None:
    unexpected = [sorted(c) for c in cycles(import_graph()) if c not in ALLOWED]
    assert not unexpected, f"import cycles: {unexpected}"


def test_the_check_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [frozenset({"a", "b", "c"})]


def test_the_graph_sees_relative_imports_of_submodules() -> None:
    graph = import_graph()
    assert "django_dbworker.rows.store" in graph["django_dbworker.rows.runner"]
    assert "django_dbworker.db.engine" in graph["django_dbworker.db.postgresql"]
