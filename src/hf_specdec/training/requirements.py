"""The `[train]` extra, checked when `hf_specdec.training` is imported, before any of its modules imports it."""

from hf_specdec.extras import require

require("train", "datasets", "peft", purpose="hf_specdec.training (training heads)")
