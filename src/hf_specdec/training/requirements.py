"""The `[train]` extra, checked when `hf_specdec.training` is imported, before any of its modules imports it."""

import importlib.util

for _module in ("datasets", "peft"):
    if importlib.util.find_spec(_module) is None:
        raise ImportError(
            f'hf_specdec.training needs {_module}, which is not installed: pip install "hf_specdec[train]".'
        )
