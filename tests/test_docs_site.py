"""The documentation site (mkdocs.yml): a strict build fails on each kind of broken link,
so scripts/test's `mkdocs build --strict` step cannot pass over one; the API reference
covers every public name, each with its docstring. No database needed. (A `:::` of a
name that does not exist is an error of mkdocstrings, which fails any build.)

They need the docs extra (MkDocs, mkdocstrings, griffe; scripts/test installs it). Without
it they are skipped loudly, except under CI=true, where they fail.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.on_database("sqlite", "the docs site: no database")

REFERENCE = ROOT / "docs" / "reference"
# A `::: path` line of a reference page, and the `members: [...]` option under it, if any.
DIRECTIVE = re.compile(r"^::: (?P<path>[\w.]+)\n(?P<options>(?:[ \t]+.*\n)*)", re.MULTILINE)
MEMBERS = re.compile(r"^\s+members: \[(?P<names>[^\]]*)\]", re.MULTILINE)
# A warning of MkDocs' log, with the indented lines that continue it.
WARNING = re.compile(r"^WARNING .*(?:\n[ \t]+.*)*", re.MULTILINE)


def _need(module: str) -> None:
    try:
        __import__(module)
    except ImportError:
        banner = (f"\n{'!' * 78}\nDOCS SITE TESTS NOT RUN: the Python package {module} is "
                  "not installed (pip install -e '.[docs]')\n" + "!" * 78)
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(banner + "\nUnder CI=true this is a failure.", pytrace=False)
        pytest.skip(banner)


def _copy_of_the_tree(tmp_path: Path) -> Path:
    """The project as mkdocs sees it, with docs/ and mkdocs.yml copied (to be broken) and
    everything else beside them linked."""
    tree = tmp_path / "tree"
    tree.mkdir()
    shutil.copytree(ROOT / "docs", tree / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tree / "mkdocs.yml")
    for entry in ROOT.iterdir():
        if entry.name not in ("docs", "mkdocs.yml", "site", ".git") \
                and not entry.name.startswith(".venv"):
            (tree / entry.name).symlink_to(entry)
    return tree


def _build(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
         str(tree.parent / "site")],
        cwd=tree, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + "\n" + text + "\n")


def test_a_strict_build_fails_naming_each_broken_link(tmp_path):
    """A link to a missing page, a missing anchor, a missing repository file, a missing
    API name, and a page left out of the nav: each is reported, and the build fails. The
    copy has no other warning, so the failure is theirs."""
    _need("mkdocs")
    tree = _copy_of_the_tree(tmp_path)
    _append(tree / "docs" / "quickstart.md",
            "[a page](no-such-page.md), [an anchor](workers.md#no-such-section), "
            "[a file](../example_project/no_such_file.py), "
            "[a name][django_dbworker.no_such_name].")
    (tree / "docs" / "orphan.md").write_text("# A page the nav does not list\n")

    run = _build(tree)

    output = run.stdout + run.stderr
    assert run.returncode != 0, output
    warnings = WARNING.findall(output)
    for broken in ("no-such-page.md", "#no-such-section", "no_such_file.py",
                   "django_dbworker.no_such_name", "orphan.md"):
        assert [line for line in warnings if broken in line], (broken, output)
    assert len(warnings) == 5, output
    assert "Aborted with 5 warnings in strict mode" in output


def _directives() -> list[tuple[str, list[str] | None]]:
    """``(path, members)`` of every ``:::`` of the reference pages (members: None when the
    page does not choose them)."""
    found = []
    for page in sorted(REFERENCE.glob("*.md")):
        for match in DIRECTIVE.finditer(page.read_text()):
            chosen = MEMBERS.search(match["options"])
            members = None if chosen is None else [
                name.strip() for name in chosen["names"].split(",") if name.strip()]
            found.append((match["path"], members))
    return found


def test_every_public_name_has_its_entry_in_the_api_reference():
    import django_dbworker

    documented = {path for path, _ in _directives()}
    missing = [name for name in django_dbworker.__all__
               if f"django_dbworker.{name}" not in documented]
    assert not missing, f"names of django_dbworker.__all__ without a ::: in docs/reference/: "\
                        f"{missing}"


def test_every_object_of_the_api_reference_has_docstrings():
    """Each object a reference page shows, and each public member it shows, has a
    docstring (the site leaves out members without one)."""
    _need("griffe")
    import griffe

    package = griffe.load("django_dbworker", search_paths=[str(ROOT)],
                          extensions=griffe.load_extensions("griffe_sphinx"))
    undocumented = []
    for path, members in _directives():
        obj = package[path.removeprefix("django_dbworker.")] if path != "django_dbworker" \
            else package
        if obj.is_module:
            names = [name for name, member in obj.members.items()
                     if not name.startswith("_") and not member.is_alias]
        elif members is not None:
            names = members
        else:
            names = [name for name in obj.members if not name.startswith("_")]
        if not obj.is_module and not obj.docstring:
            undocumented.append(path)
        undocumented += [f"{path}.{name}" for name in names if not obj.members[name].docstring]
    assert not undocumented, f"shown in docs/reference/ without a docstring: {undocumented}"


def _hooks():
    _need("mkdocs")
    import importlib.util

    spec = importlib.util.spec_from_file_location("mkdocs_hooks",
                                                  ROOT / "scripts" / "mkdocs_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rewrite(markdown: str, repo_url: str | None) -> str:
    from types import SimpleNamespace

    page = SimpleNamespace(file=SimpleNamespace(
        src_uri="workers.md", abs_src_path=str(ROOT / "docs" / "workers.md")))
    config = SimpleNamespace(docs_dir=str(ROOT / "docs"), repo_url=repo_url)
    return _hooks().on_page_markdown(markdown, page=page, config=config, files=None)


def test_links_to_repository_files_go_to_the_repository_url():
    text = ("[`example_project/`](../example_project/), [the README](../README.md#status), "
            "[tasks](tasks.md#cron), [Django](https://www.djangoproject.com/)\n"
            "```python\n[not a link](../README.md)\n```\n")
    assert _rewrite(text, "https://forge.example/o/r/") == (
        "[`example_project/`](https://forge.example/o/r/tree/main/example_project), "
        "[the README](https://forge.example/o/r/blob/main/README.md#status), "
        "[tasks](tasks.md#cron), [Django](https://www.djangoproject.com/)\n"
        "```python\n[not a link](../README.md)\n```\n")


def test_without_a_repository_url_they_show_the_path():
    text = "[`example_project/`](../example_project/), [the\nREADME](../README.md)"
    assert _rewrite(text, None) == (
        "`example_project/`, the\nREADME (`README.md` in the repository)")


def test_a_link_to_a_missing_repository_file_is_a_warning_naming_it(caplog):
    text = "[gone](../example_project/no_such_file.py)"
    assert _rewrite(text, "https://forge.example/o/r") == "gone"
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "repository_links: Doc file 'workers.md' links to "
        "'../example_project/no_such_file.py', but 'example_project/no_such_file.py' does "
        "not exist in the repository."]
