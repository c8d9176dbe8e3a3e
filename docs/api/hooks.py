"""MkDocs hooks of the documentation site: the repository's README is its home page.

The README lives at the repository root, outside `docs/`, and links to the guides as `docs/<page>.md`; on the
site it is `index.md`, next to the guides, so those links lose their `docs/` prefix.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

README = Path(__file__).resolve().parents[2] / "README.md"
_GUIDE_LINK = re.compile(r"\]\(docs/")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the README as the site's `index.md`."""
    files.append(File.generated(config, "index.md", abs_src_path=str(README)))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Point the README's links to the guides at the guides' pages on the site."""
    if page.file.src_uri == "index.md":
        return _GUIDE_LINK.sub("](", markdown)
    return markdown
