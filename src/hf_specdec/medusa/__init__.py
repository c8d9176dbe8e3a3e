"""Medusa heads (Cai et al. 2023): extra prediction heads on the base's last hidden state, verified as a tree."""

from hf_specdec.medusa.config import MedusaConfig
from hf_specdec.medusa.heads import MedusaHeads, ResBlock
from hf_specdec.medusa.model import MedusaForCausalLM

__all__ = ["MedusaConfig", "MedusaForCausalLM", "MedusaHeads", "ResBlock"]
