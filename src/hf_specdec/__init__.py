"""hf_specdec: lossless speculative decoding for Hugging Face transformers causal LMs, at any batch size."""

from hf_specdec.api.entry import speculative_generate
from hf_specdec.api.mixin import SpeculativeGenerationMixin, speculative
from hf_specdec.cpu_linears import can_pack_linears, pack_linears, unpack_linears
from hf_specdec.drafters.decoding import speculative_decode
from hf_specdec.drafters.draft_length import DraftLengthPolicy
from hf_specdec.drafters.lookup import PromptLookupDrafter
from hf_specdec.generation.acceptance import (
    greedy_accept,
    point_draft_sampling,
    residual_distribution,
    speculative_sampling,
)
from hf_specdec.generation.decisions import SpeculativeCosts
from hf_specdec.generation.outputs import SpeculativeDecoderOnlyOutput, SpeculativeStats
from hf_specdec.medusa import DraftHeads, MedusaConfig, MedusaForCausalLM, MedusaHeads, RecurrentHeads
from hf_specdec.medusa.eagle import EagleHeads
from hf_specdec.medusa.eagle3 import Eagle3Heads
from hf_specdec.trees.dynamic import DynamicTree
from hf_specdec.trees.static import DraftTree, build_tree, preset_tree

__all__ = [
    "DraftHeads",
    "DraftLengthPolicy",
    "DraftTree",
    "DynamicTree",
    "Eagle3Heads",
    "EagleHeads",
    "MedusaConfig",
    "MedusaForCausalLM",
    "MedusaHeads",
    "PromptLookupDrafter",
    "RecurrentHeads",
    "SpeculativeCosts",
    "SpeculativeDecoderOnlyOutput",
    "SpeculativeGenerationMixin",
    "SpeculativeStats",
    "build_tree",
    "can_pack_linears",
    "greedy_accept",
    "pack_linears",
    "point_draft_sampling",
    "preset_tree",
    "residual_distribution",
    "speculative",
    "speculative_decode",
    "speculative_generate",
    "speculative_sampling",
    "unpack_linears",
]

__version__ = "0.1.0"
