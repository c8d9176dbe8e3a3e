"""The training recipe's entry point, for tests that run it (the recipes folder is not a package)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "train_medusa.py"


def recipe_main() -> Callable[[list[str] | None], None]:
    """`main` of `recipes/train_medusa.py`: runs the recipe on a list of command-line arguments."""
    spec = importlib.util.spec_from_file_location("train_medusa", RECIPE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main
