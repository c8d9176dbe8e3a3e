"""`MedusaForCausalLM` in transformers' causal-LM mapping, so that `pipeline("text-generation", model=heads,
tokenizer=tok)` takes a heads model as the causal LM it is (without it, the pipeline logs that the class is not
supported for text generation, then runs it anyway).

The mapping pairs a model class with a config class: `MedusaAutoConfig` names the heads model there and nothing
more. Heads are built with `MedusaForCausalLM.from_base` or loaded with `MedusaForCausalLM.from_pretrained`, never
from this config.
"""

from __future__ import annotations

from transformers import AutoModelForCausalLM, PretrainedConfig

from hf_specdec.medusa.model import MedusaForCausalLM


class MedusaAutoConfig(PretrainedConfig):
    """The config class `MedusaForCausalLM` is registered under in `AutoModelForCausalLM`'s mapping."""

    model_type = "hf_specdec_medusa"


AutoModelForCausalLM.register(MedusaAutoConfig, MedusaForCausalLM, exist_ok=True)
