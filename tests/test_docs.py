"""The docs match the code: the tests docs/bad-input.md names, the system checks of
docs/checks.md, the README's two quick-start commands. No database needed."""

from __future__ import annotations

import ast
import re

from tests.conftest import ROOT

REFERENCE = re.compile(r"`(test_\w+\.py)::([\w:]+)`")
SHORT = re.compile(r"`::(\w+)`")


def _defined(path) -> set[str]:
    """Test functions and ``Class::method`` names defined in a test module."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names |= {f"{node.name}::{f.name}" for f in node.body
                      if isinstance(f, ast.FunctionDef)}
    return names


def test_every_test_named_in_the_bad_input_catalogue_exists():
    text = (ROOT / "docs" / "bad-input.md").read_text()
    named = REFERENCE.findall(text)
    assert len(named) > 100, "the catalogue names its tests as `test_x.py::name`"
    missing = [f"{module}::{name}" for module, name in named
               if not (ROOT / "tests" / module).exists()
               or name not in _defined(ROOT / "tests" / module)]
    assert not missing, f"docs/bad-input.md names tests that do not exist: {missing}"
    assert not SHORT.findall(text), "write each test as `test_x.py::name`"


CHECK_ID = re.compile(r"""\bid=["'](django_dbworker\.[EW]\d{3})["']""")
CHECK_ROW = re.compile(r"^\| `(django_dbworker\.[EW]\d{3})` \|", re.MULTILINE)


def test_the_checks_in_the_code_are_the_rows_of_docs_checks_md():
    """Every check id the package can raise has its row in docs/checks.md, and every row
    is a check the package raises (the database's own too: SQLite's, MariaDB's)."""
    raised = {found for path in (ROOT / "django_dbworker").rglob("*.py")
              for found in CHECK_ID.findall(path.read_text())}
    rows = CHECK_ROW.findall((ROOT / "docs" / "checks.md").read_text())
    assert len(raised) > 10, "the check ids are written as id=\"django_dbworker.X000\""
    assert len(rows) == len(set(rows)), f"a check has two rows: {sorted(rows)}"
    assert sorted(raised - set(rows)) == [], "checks without a row in docs/checks.md"
    assert sorted(set(rows) - raised) == [], "rows of docs/checks.md that nothing raises"


def test_the_readmes_quick_start_has_two_commands():
    """Set-up stays two commands: scripts/demo and scripts/test."""
    text = (ROOT / "README.md").read_text()
    quick_start = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```console\n(.*?)```", quick_start, re.DOTALL)
    assert [c.strip() for c in commands] == ["scripts/demo", "scripts/test"]
