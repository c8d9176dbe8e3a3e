"""Self-speculation by early exit (LayerSkip): the target's own first layers draft for it.

`early_exit_draft(model, n)` is a causal LM of the target's class and configuration cut to its first `n` decoder
layers, over the target's own tensors: its embeddings, those `n` layers, its final norm and its lm_head, shared,
not copied. It drafts as any draft model does (`generate(assistant_early_exit=n)` passes it as the draft), with a
KV cache of its own, exactly as transformers' `EarlyExitCandidateGenerator` runs the target with
`num_hidden_layers = n`. It pays on models trained to exit early (LayerSkip checkpoints); on others its drafts are
rarely accepted, and the adaptive schedule then takes plain steps.
"""

from __future__ import annotations

import copy

import torch
from transformers import PreTrainedModel

from hf_specdec.generation.model_class import original_class
from hf_specdec.generation.recurrent import has_recurrent_layers, recurrent_cache


def early_exit_draft(model: PreTrainedModel, num_layers: int) -> PreTrainedModel:
    """The first `num_layers` decoder layers of `model`, with its embeddings, final norm and lm_head, as a causal
        LM of `model`'s class that shares `model`'s parameters (built at each call, in no memory of its own: a later
    `model.to(...)` cannot leave it behind).

        Raises:
            `ValueError`: when `num_layers` is not between 1 and the model's number of layers minus one, or the model
                does not say how many decoder layers it has.
    """
    config = model.config
    total = getattr(config, "num_hidden_layers", None)
    if not isinstance(total, int):
        raise ValueError(
            f"{type(model).__name__}'s config does not give its number of decoder layers (`num_hidden_layers`), "
            "so its first layers cannot be cut out to draft with. Pass a draft model as `assistant=` instead."
        )
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or not 1 <= num_layers < total:
        raise ValueError(
            f"assistant_early_exit must be a number of layers between 1 and {total - 1} (the target has {total}), "
            f"got {num_layers!r}."
        )
    return _cut(model, num_layers)


def _cut(model: PreTrainedModel, num_layers: int) -> PreTrainedModel:
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = num_layers
    layer_types = config.__dict__.get("layer_types")  # a list of the config's own (some configs derive it)
    if isinstance(layer_types, list):
        config.layer_types = layer_types[:num_layers]
    with torch.device("meta"):  # no memory: every tensor is the target's (assigned below)
        draft = original_class(model)(config)
    state = model.state_dict(keep_vars=True)  # the parameters themselves, not detached copies
    missing, _ = draft.load_state_dict(state, strict=False, assign=True)
    if missing:
        raise ValueError(
            f"{type(model).__name__} cannot be cut to its first {num_layers} layers: the cut model's tensors "
            f"{missing[:3]} are not the target's. Pass a draft model as `assistant=` instead."
        )
    for name, buffer in list(draft.named_buffers()):
        if buffer.is_meta:  # buffers outside the state dict (rotary frequencies): the target's own
            module_name, _, attribute = name.rpartition(".")
            module = draft.get_submodule(module_name)
            persistent = attribute not in module._non_persistent_buffers_set
            module.register_buffer(attribute, model.get_buffer(name), persistent=persistent)
    draft.generation_config = copy.deepcopy(model.generation_config)
    draft.eval()
    if has_recurrent_layers(draft):
        recurrent_cache(draft)  # a cut whose config no longer describes its layers is refused here
    return draft
