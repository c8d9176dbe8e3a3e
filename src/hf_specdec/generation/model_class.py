"""What [`speculative`] did to a model's class, read back: the class it had before, and the `generate()` that
transformers gives that class.

`speculative(model)` swaps the class of `model` for one that mixes `SpeculativeGenerationMixin` in before it; both
carry a mark in their own namespace, so that code which must reach past the mixin (the early-exit draft, built as
the model's own class; the speculative entry, handing a prepared call to transformers) needs no import of it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from transformers import GenerationMixin, PreTrainedModel

#: In the namespace of the classes `speculative()` builds.
SPECULATIVE_CLASS = "_hf_specdec_speculative"
#: In the namespace of `SpeculativeGenerationMixin`.
SPECULATIVE_MIXIN = "_hf_specdec_mixin"


def original_class(model: PreTrainedModel) -> type:
    """The class `model` had before `speculative()` (its class when it never went through it)."""
    cls = type(model)
    return cls.__mro__[2] if cls.__dict__.get(SPECULATIVE_CLASS) else cls


def transformers_generate(model: PreTrainedModel) -> Callable[..., Any]:
    """`model`'s `generate()` as transformers gives its class: past this library's mixin, whether or not
    `speculative()` was applied to `model`."""
    for cls in type(model).__mro__:
        method = cls.__dict__.get("generate")
        if method is not None and not cls.__dict__.get(SPECULATIVE_MIXIN):
            return functools.partial(method, model)
    return functools.partial(GenerationMixin.generate, model)
