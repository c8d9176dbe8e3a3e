"""hf_specdec: lossless speculative decoding for Hugging Face transformers causal LMs, at any batch size."""

from hf_specdec.acceptance import greedy_accept, residual_distribution, speculative_sampling
from hf_specdec.decoding import speculative_decode
from hf_specdec.draft_length import DraftLengthPolicy
from hf_specdec.mixin import SpeculativeGenerationMixin, speculative
from hf_specdec.outputs import SpeculativeDecoderOnlyOutput, SpeculativeStats

__all__ = [
    "DraftLengthPolicy",
    "SpeculativeDecoderOnlyOutput",
    "SpeculativeGenerationMixin",
    "SpeculativeStats",
    "greedy_accept",
    "residual_distribution",
    "speculative",
    "speculative_decode",
    "speculative_sampling",
]

__version__ = "0.1.0"
