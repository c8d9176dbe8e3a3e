"""The documentation site builds with `mkdocs build --strict` (mkdocs.yml), and its API reference, generated from
the docstrings, documents the library's public names: a name missing from the pages, a page missing from the nav,
a broken link between pages or an unresolved cross-reference fails here."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from html import unescape
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "hf_specdec"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
         "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    return out


def _public_names(package: Path) -> list[str]:
    """`__all__` of a package's `__init__.py`, read without importing it."""
    for node in ast.parse((package / "__init__.py").read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"{package} has no __all__")


def _page(site: Path, name: str) -> str:
    return (site / "api" / name / "index.html").read_text(encoding="utf-8")


def _anchors(html: str) -> set[str]:
    return set(re.findall(r'id="(hf_specdec[\w.]*)"', html))


def _section(html: str, anchor: str) -> str:
    """The rendered documentation of `anchor` itself: up to the next documented object (its first member, or the
    next object of the page)."""
    start = html.index(f'id="{anchor}"')
    following = re.search(r'id="hf_specdec[\w.]*"', html[start + 1 :])
    return html[start : start + 1 + following.start() if following else len(html)]


def _text(html: str) -> str:
    return " ".join(unescape(re.sub(r"<[^>]+>", "", html)).split())


def _parameters(section: str) -> set[str]:
    return set(re.findall(r"<b><code>\**(\w+)</code></b>", section))


def test_every_top_level_name_has_its_reference(site: Path) -> None:
    anchors = set().union(*(_anchors(page.read_text(encoding="utf-8")) for page in (site / "api").glob("*/index.html")))
    missing = [name for name in _public_names(PACKAGE) if f"hf_specdec.{name}" not in anchors]
    assert not missing, f"hf_specdec names without an entry in docs/api/: {missing}"


@pytest.mark.parametrize("subpackage", ["training", "simulator", "serving"])
def test_every_class_and_function_of_a_subpackage_has_its_reference(site: Path, subpackage: str) -> None:
    documented = {anchor.rsplit(".", 1)[-1] for anchor in _anchors(_page(site, subpackage))}
    # Constants (upper-case names) are listed where they have a docstring of their own.
    names = [name for name in _public_names(PACKAGE / subpackage) if not name.isupper()]
    missing = [name for name in names if name not in documented]
    assert not missing, f"hf_specdec.{subpackage} names without an entry in docs/api/{subpackage}.md: {missing}"


def test_generate_documents_the_speculative_arguments(site: Path) -> None:
    html = _page(site, "generation")
    generate = _section(html, "hf_specdec.SpeculativeGenerationMixin.generate")
    expected = {
        "inputs",
        "generation_config",
        "assistant",
        "assistant_early_exit",
        "use_mtp",
        "prompt_lookup_num_tokens",
        "max_matching_ngram_size",
        "tree",
        "num_assistant_tokens",
        "num_assistant_tokens_schedule",
        "assistant_confidence_threshold",
        "assistant_vocab",
        "assistant_ensemble_weight",
        "speculative_costs",
        "generator",
        "kwargs",
    }
    assert expected <= _parameters(generate), sorted(expected - _parameters(generate))
    for section in ("Returns:", "Raises:"):
        assert section in generate
    text = _text(generate)
    assert "SpeculativeDecoderOnlyOutput" in text
    # The defaults the loop applies (`api.entry`, `generation.arguments`, `drafters.draft_tree`).
    for default in ("schedule (default 8)", "matches (default 3)", '"adaptive" (default', "at most 8 deep with 2"):
        assert default in text, default


def test_dynamic_tree_states_each_drafters_defaults(site: Path) -> None:
    tree = _section(_page(site, "trees"), "hf_specdec.DynamicTree")
    assert {"num_nodes", "depth", "top_k"} <= _parameters(tree)
    text = _text(tree)
    for drafter in ("draft model (assistant=)", "MTP layers (use_mtp=True)", "Medusa and recurrent heads", "EAGLE"):
        assert drafter in text, drafter


def test_readme_is_the_home_page_and_links_to_the_guides(site: Path) -> None:
    page = (site / "index.html").read_text(encoding="utf-8")
    home = page[page.index('role="main"') : page.index("<footer")]  # the README, without the navigation
    assert "hf_specdec" in _text(home)
    for guide in ("usage", "training", "serving", "simulator", "benchmarks", "refusals"):
        assert (site / guide / "index.html").exists()
        assert f'href="{guide}/' in home, f"the README's link to docs/{guide}.md does not lead to its page"
