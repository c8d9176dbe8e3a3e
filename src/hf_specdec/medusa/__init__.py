"""Medusa heads (Cai et al. 2023) and recurrent draft heads on the base's last hidden state, verified as a
tree."""

from hf_specdec.medusa import auto as _auto  # noqa: F401  (registers MedusaForCausalLM with transformers)
from hf_specdec.medusa.config import MedusaConfig
from hf_specdec.medusa.heads import DraftHeads, MedusaHeads, ResBlock
from hf_specdec.medusa.model import MedusaForCausalLM
from hf_specdec.medusa.recurrent import RecurrentHeads

__all__ = ["DraftHeads", "MedusaConfig", "MedusaForCausalLM", "MedusaHeads", "RecurrentHeads", "ResBlock"]
