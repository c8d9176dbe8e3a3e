"""Training Medusa heads with the ecosystem's tools: `datasets`, `Trainer`, PEFT (the `[train]` extra)."""

import hf_specdec.training.requirements  # noqa: F401  (first: names the extra to install)

# isort: split

from hf_specdec.training.collator import MedusaCollator
from hf_specdec.training.data import load_records, tokenize_conversation, tokenize_records
from hf_specdec.training.evaluation import evaluate_heads
from hf_specdec.training.hidden_cache import cache_hidden_states
from hf_specdec.training.metrics import HeadMetrics
from hf_specdec.training.pipeline import MedusaTrainingConfig, train_medusa
from hf_specdec.training.self_distill import self_distill, self_distill_with_states
from hf_specdec.training.trainer import MedusaTrainer

__all__ = [
    "HeadMetrics",
    "MedusaCollator",
    "MedusaTrainer",
    "MedusaTrainingConfig",
    "cache_hidden_states",
    "evaluate_heads",
    "load_records",
    "self_distill",
    "self_distill_with_states",
    "tokenize_conversation",
    "tokenize_records",
    "train_medusa",
]
