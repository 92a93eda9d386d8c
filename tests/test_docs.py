"""The docs name tests that exist: every ``test_x.py::name`` in docs/bad-input.md."""

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
