"""Every `python` block of docs/usage.md runs, in order, in one namespace."""

from __future__ import annotations

import re

import pytest
import torch

from tests.docs_blocks import DOCS, README, python_blocks, run_python


def test_usage_page_has_examples() -> None:
    assert len(python_blocks(DOCS / "usage.md")) >= 3


@pytest.mark.real_model
def test_usage_examples_run(monkeypatch) -> None:
    """The page's compiled example compiles with dynamo's eager backend here: the graphs, guards and static shapes
    are what the example shows; inductor's code generation for a 30-layer model would take minutes on this CPU,
    and tests/test_static_cache.py runs it on tiny models."""
    compile_with_inductor = torch.compile

    def compile_eagerly(model=None, **options):
        options = {k: v for k, v in options.items() if k not in ("backend", "mode", "options")}
        return compile_with_inductor(model, backend="eager", **options)

    monkeypatch.setattr(torch, "compile", compile_eagerly)
    monkeypatch.chdir(DOCS.parent)  # the page's paths are relative to the repository's root
    namespace: dict = {}
    for block in python_blocks(DOCS / "usage.md"):
        run_python(block, DOCS / "usage.md", namespace)


@pytest.mark.real_model
def test_readme_examples_run(tmp_path, monkeypatch) -> None:
    """The README's `python` blocks run in order, as written, with the Hub ids they name read from local copies:
    SmolLM2-135M-Instruct stands in for both Qwen models (one tokenizer), and untrained EAGLE-3 heads on it for
    `path/to/heads` (greedy output is the base's whatever the heads guess)."""
    from hf_specdec import MedusaConfig, MedusaForCausalLM
    from hf_specdec.zoo import load_model, model_path

    local = str(model_path("smollm2-135m"))
    base, _ = load_model("smollm2-135m", dtype=torch.float32)
    MedusaForCausalLM.from_base(base, MedusaConfig(num_heads=2, head_type="eagle3")).save_pretrained(tmp_path / "h")
    stand_ins = {
        "Qwen/Qwen2.5-Coder-1.5B-Instruct": local,
        "Qwen/Qwen2.5-Coder-0.5B-Instruct": local,
        "path/to/heads": str(tmp_path / "h"),
    }
    blocks = python_blocks(README)
    assert len(blocks) >= 2
    namespace: dict = {}
    for block in blocks:
        run_python(block, README, namespace, stand_ins)
    assert namespace["out"].shape[0] == 2


# Traces of how the library was built, which a user's page has no use for: work sessions, issue numbers and
# machine-local run folders.
_HISTORY = re.compile(
    r"\bsession \d+|\bsessions? of (work|development)|(?<![\w&(/#-])#\d{1,3}\b|/work/runs|bench_results/s\d+_",
    re.IGNORECASE,
)


def test_user_pages_speak_of_the_library_not_of_how_it_was_built() -> None:
    pages = [README, DOCS.parent / "CONTRIBUTING.md", *sorted(DOCS.glob("*.md"))]
    found = [
        f"{page.name}:{number}: {line.strip()}"
        for page in pages
        for number, line in enumerate(page.read_text().splitlines(), 1)
        if _HISTORY.search(line)
    ]
    assert not found, "\n".join(found)
    assert _HISTORY.search("as measured in session 4") and _HISTORY.search("fixed in #16")
    assert not _HISTORY.search("see [Recipes](#recipes) and `--use_py_session`")


def test_the_readme_fits_in_its_outline() -> None:
    """What it is, the two set-up commands first, one results table, links: at most 150 lines."""
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    first_block = text.split("```bash", 1)[1].split("```", 1)[0]
    assert "hf-specdec demo" in first_block and "python -m pytest" in first_block
    assert text.count("<!-- results:") == 1
