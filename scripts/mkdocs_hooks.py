"""MkDocs hooks (mkdocs.yml, ``hooks:``): links from docs/ to files of the repository.

The pages in docs/ link to files outside docs/ (``../example_project/images/workers.py``,
``../bench/README.md#...``, ``../README.md``) so that they work where the repository is
read (a checkout, a forge's file view). MkDocs cannot follow them, and --strict fails on
them. Before a page is converted, each such link is checked and rewritten:

- its target must exist in the repository, else a warning names the page and the link
  (and --strict fails the build, as for a broken link between pages; without --strict
  the link becomes its text);
- with ``repo_url`` set in mkdocs.yml, it links to the file (``blob``) or folder (``tree``)
  on the ``main`` branch there;
- without ``repo_url`` it becomes text: the link's text, followed by the file's path in the
  repository when the text does not already show it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from mkdocs.plugins import get_plugin_logger

log = get_plugin_logger("repository_links")

BRANCH = "main"
# An inline link ``[text](target)`` or ``[text](target "title")``; text may span lines.
LINK = re.compile(r"\[(?P<text>[^\]]+)\]\((?P<target>[^)\s]+)(?P<title>\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)


def on_page_markdown(markdown: str, *, page: Any, config: Any, files: Any) -> str:
    # Paths as written, not resolved: a symlinked copy of the tree (tests) stays inside it.
    docs = Path(os.path.abspath(config.docs_dir))
    root = docs.parent
    source = Path(os.path.abspath(page.file.abs_src_path)).parent

    def rewrite(match: re.Match[str]) -> str:
        target = match["target"]
        if re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", target):
            return match[0]  # a URL, an anchor on the page, an absolute path: MkDocs' own
        path, _, anchor = target.partition("#")
        resolved = Path(os.path.normpath(source / unquote(path)))
        if resolved == docs or docs in resolved.parents:
            return match[0]  # a page or file of the site: MkDocs checks it
        if root not in resolved.parents and resolved != root:
            log.warning(f"Doc file '{page.file.src_uri}' links to '{target}', which is "
                        "outside the repository.")
            return match["text"]
        if not resolved.exists():
            log.warning(f"Doc file '{page.file.src_uri}' links to '{target}', but "
                        f"'{resolved.relative_to(root)}' does not exist in the repository.")
            return match["text"]
        relative = resolved.relative_to(root).as_posix()
        repo_url = (config.repo_url or "").rstrip("/")
        if repo_url:
            kind = "tree" if resolved.is_dir() else "blob"
            url = f"{repo_url}/{kind}/{BRANCH}/{relative}" + (f"#{anchor}" if anchor else "")
            return f"[{match['text']}]({url}{match['title'] or ''})"
        shown = relative + ("/" if resolved.is_dir() else "")
        if shown in match["text"]:
            return match["text"]
        return f"{match['text']} (`{shown}` in the repository)"

    # Links inside fenced code blocks are code, not links: leave them alone.
    pieces, last = [], 0
    for fence in FENCE.finditer(markdown):
        pieces.append(LINK.sub(rewrite, markdown[last:fence.start()]))
        pieces.append(fence[0])
        last = fence.end()
    pieces.append(LINK.sub(rewrite, markdown[last:]))
    return "".join(pieces)
