"""`SpeculativeGenerationMixin` and `speculative(model)`: a model whose own `generate()` takes this library's
speculative arguments (`assistant=` / `assistant_model=`, `assistant_early_exit=`, `prompt_lookup_num_tokens=`,
`tree=`, ...), at any batch size.

`speculative(model)` changes the class of `model` in place to one that mixes in [`SpeculativeGenerationMixin`]
before the model's own class: the same object, the same weights, the same architecture name in `save_pretrained`,
and `isinstance` checks unchanged. Its `generate()` is [`speculative_generate`]; without speculative arguments that
is transformers' own `generate()`, untouched, so every later call works as before (plain decoding, a
`custom_generate` recipe, another draft). To leave the model's class alone, call
`hf_specdec.speculative_generate(model, ...)` instead.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel

from hf_specdec.generation.entry import speculative_generate
from hf_specdec.generation.model_class import SPECULATIVE_CLASS, SPECULATIVE_MIXIN, original_class


class SpeculativeGenerationMixin:
    """Adds speculative decoding to `generate()`. Mix it in before the model's class, or use [`speculative`].

    `generate()` takes transformers' arguments and the speculative ones [`speculative_generate`] documents.
    """

    def generate(
        self, inputs: torch.Tensor | None = None, generation_config: GenerationConfig | None = None, *args: Any,
        **kwargs: Any,
    ) -> Any:  # fmt: skip
        """transformers' `generate()`, decoded by this library's loop when a speculative argument asks for it:
        see [`speculative_generate`]."""
        plain = super().generate  # type: ignore[misc]
        return speculative_generate(self, inputs, generation_config, *args, plain_generate=plain, **kwargs)  # type: ignore[arg-type]


setattr(SpeculativeGenerationMixin, SPECULATIVE_MIXIN, True)  # see `model_class.transformers_generate`


def _rebuild_speculative(cls: type, state: dict[str, Any]) -> PreTrainedModel:
    """Unpickle a model that `speculative()` had given speculative `generate()`: its original class, its state,
    then `speculative()` again."""
    model = cls.__new__(cls)
    model.__setstate__(state)
    return speculative(model)


def _reduce_speculative(self: PreTrainedModel, protocol: int) -> tuple[Any, ...]:
    # The class `speculative()` makes is built at run time and cannot be found by name when unpickling: pickle
    # the model as its original class and rebuild the speculative class on load.
    return _rebuild_speculative, (original_class(self), self.__getstate__())


@functools.cache
def _speculative_class(cls: type) -> type:
    # Keep the original name so `save_pretrained` records the usual architecture.
    namespace = {"__module__": cls.__module__, "__reduce_ex__": _reduce_speculative, SPECULATIVE_CLASS: True}
    return type(cls.__name__, (SpeculativeGenerationMixin, cls), namespace)


def speculative(model: PreTrainedModel) -> PreTrainedModel:
    """Give `model` speculative `generate()`: the same object, its class now mixing in
    [`SpeculativeGenerationMixin`] (see the module's docstring). Returns the model for chaining."""
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"speculative() takes a transformers PreTrainedModel, got {type(model).__name__}.")
    if not isinstance(model, SpeculativeGenerationMixin):
        model.__class__ = _speculative_class(type(model))
    return model
