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

from hf_specdec.api.entry import speculative_generate
from hf_specdec.generation.model_class import SPECULATIVE_CLASS, SPECULATIVE_MIXIN, original_class


class SpeculativeGenerationMixin:
    """Adds speculative decoding to `generate()`. Mix it in before the model's class, or use [`speculative`].

    `generate()` takes transformers' arguments and the speculative ones [`speculative_generate`] documents.
    """

    def generate(
        self, inputs: torch.Tensor | None = None, generation_config: GenerationConfig | None = None, *args: Any,
        **kwargs: Any,
    ) -> Any:  # fmt: skip
        """transformers' `generate()`, decoded by this library's speculative loop when a speculative argument asks
        for it (the same as [`speculative_generate`] on this model).

        Without any of the speculative arguments below this is the model's own transformers `generate()`,
        untouched. With one, transformers still prepares the call (generation config, logits processors, stopping
        criteria, lengths, special tokens) and this library's loop decodes it, at any batch size: greedy decoding
        returns exactly plain greedy's tokens, and sampling follows the model's distribution exactly
        (`assistant_ensemble_weight`, opt-in, is the one lossy setting). The speculative settings are read as
        `generate()` reads its own: the keyword argument, else the `generation_config` passed, else the model's
        generation config; where none sets one, the defaults below apply (not transformers' defaults for its own
        assisted decoding, `num_assistant_tokens=20` with a constant schedule).

        Draft heads (Medusa, recurrent, EAGLE, EAGLE-3) are not passed here: they decode with
        `MedusaForCausalLM.generate(medusa=True)`, which also takes the heads' `tree=` (a static tree, a preset
        or a `DynamicTree`). `medusa=` is not an argument of this method.

        Args:
            inputs (`torch.LongTensor` of shape `(batch, prompt)`, *optional*): the prompts, left-padded, as for
                transformers' `generate()` (or `input_ids=`).
            generation_config (`GenerationConfig`, *optional*): as for transformers' `generate()`; it may hold
                the speculative settings too (`num_assistant_tokens`, `prompt_lookup_num_tokens`, ...).
            *args: transformers' `generate()`'s further positional arguments. With a speculative argument, pass
                them by keyword.
            assistant (`PreTrainedModel`, *optional*): a smaller causal LM that drafts tokens the model verifies
                in one forward per step (default: none). Transformers' name, `assistant_model=`, is taken as the
                same. It shares the model's tokenizer, or passes its own as `assistant_tokenizer=` (with the
                model's as `tokenizer=`): its drafts are then re-encoded through text (chains only, without
                `tree=`, prompt lookup or `assistant_vocab`). A PEFT model whose adapters live in its layers
                (LoRA) drafts as the adapted model.
            assistant_early_exit (`int`, *optional*): self-speculation: the model's own first
                `assistant_early_exit` layers, final norm and lm_head draft, sharing its weights (default: off).
                They take a draft model's place (the settings below for a draft model apply to them), and cannot
                be combined with `assistant=`.
            use_mtp (`bool`, *optional*): the model's own multi-token-prediction layers draft (configs with
                `num_mtp_layers`); with `tree=`, trees grown from its first MTP layer (default: off).
            prompt_lookup_num_tokens (`int`, *optional*): draft by prompt lookup: each row proposes up to this
                many tokens that followed its last n-gram where it last occurred in the row (default: off). Alone,
                no draft model runs; with a draft model too, each step drafts with whichever of the two is expected
                to commit more tokens per unit of cost; with `tree=`, each row's continuation is grafted onto its
                tree.
            max_matching_ngram_size (`int`, *optional*): the longest n-gram prompt lookup matches (default 3).
                Needs `prompt_lookup_num_tokens`.
            tree (`DynamicTree` or `int`, *optional*): the draft model grows a tree per row and step instead of a
                chain, verified in one forward (default: chains). An `int` is a number of nodes, grown at most 8
                deep with 2 children per node; a `DynamicTree` without a `depth` grows at most 8 deep. With
                `use_mtp=True` these defaults are 4 deep and 4 children per node. Needs a draft model
                (`assistant=` or `assistant_early_exit`) or `use_mtp=True`.
            num_assistant_tokens (`int`, *optional*): tokens a draft model drafts per step, the most per step
                with the `"adaptive"` schedule (default 8). Not with `tree=` (the tree sets the shape).
            num_assistant_tokens_schedule (`str`, *optional*): `"adaptive"` (default: draft, and grow trees, only
                as far as the next draft forward is expected to pay for its cost, and take plain steps where
                drafting does not pay), `"constant"` (`num_assistant_tokens`, or the whole tree, at every step) or
                `"heuristic"` (transformers' schedule: +2 after a step where every row accepted every draft, else
                -1; a draft model's chains only). With prompt lookup alone, `"constant"` always proposes
                `prompt_lookup_num_tokens` tokens.
            assistant_confidence_threshold (`float`, *optional*): stop drafting once the draft model's top
                probability falls below this in every row, in [0, 1) (default: off). Not with `tree=`.
            assistant_vocab (`torch.LongTensor` or list of ids, *optional*): the only token ids the draft model
                may propose, e.g. the most frequent ones (`hf_specdec.drafters.vocab.draft_vocabulary`): each
                draft forward then projects onto those rows of its lm_head only. Lossless (default: the draft's
                whole vocabulary). Needs a draft model.
            assistant_ensemble_weight (`float`, *optional*): sampling with a draft model only, **lossy**: drafted
                tokens are verified against `w * p + (1 - w) * q` (the model's and the draft's distributions)
                instead of `p`, with `w` in (0, 1] (default: off, exact speculative sampling).
            speculative_costs (`SpeculativeCosts`, *optional*): fixed costs of a draft forward and of verifying
                one more token, for every adaptive decision (default: measured while decoding). Decisions then
                depend on the tokens alone, so seeded sampling is bitwise reproducible on a fixed machine.
            generator (`torch.Generator`, *optional*): the randomness of sampling (default: torch's global
                generator). An extension of this library: transformers' own `generate()` has no such argument,
                and a call without a speculative argument (which is transformers' own) rejects it, as it rejects
                `speculative_costs=`.
            **kwargs: every other argument of transformers' `generate()`: `attention_mask`, `max_new_tokens`,
                `do_sample` and the sampling settings, `stopping_criteria`, `stop_strings` (with `tokenizer=`),
                `streamer`, a cache to continue from (`cache=` or `past_key_values=`),
                `return_dict_in_generate`, `output_scores`, `output_logits`, ... A `custom_generate` recipe
                from the Hub (a repository name) receives every argument, the speculative ones included, and
                decides what to do with them. Transformers' speculative methods that this loop does not run stay
                transformers' own when asked for with its `assistant_model=` (an assistant that attends to the
                model's cache, such as Gemma 4's, or `speculation_type="dflash"`).

        Returns:
            What transformers' `generate()` returns: a `torch.LongTensor` of shape `(batch, prompt + new
            tokens)`, the prompts followed by the generated tokens; or, with `return_dict_in_generate=True`, a
            `SpeculativeDecoderOnlyOutput` (transformers' `GenerateDecoderOnlyOutput` with `speculative`, the
            call's statistics per row, as `SpeculativeStats`) when the library's loop decoded the call.

        Raises:
            `ValueError`: on a speculative call, before any decoding, for what speculative decoding cannot give plain
                `generate()`'s result on: models it cannot run (encoder-decoder models, recurrent states, ALiBi
                positions, ...), a draft model of another vocabulary without both tokenizers, prompts it cannot decode
                (empty, right-padded, all padding, ids outside the vocabulary, `inputs_embeds=`), decoding strategies of
                another kind (beam search, contrastive search, DoLa, classifier-free guidance, a `custom_generate`
                callable, `synced_gpus=True`, `use_cache=False`, `output_attentions`, `output_hidden_states`), and
                speculative settings that conflict (`assistant=` with `assistant_model=` or `assistant_early_exit`;
                `tree=`, `assistant_vocab` or `assistant_ensemble_weight` without a draft model; `num_assistant_tokens`
                or `assistant_confidence_threshold` with `tree=` or without a draft model; `"heuristic"` with `tree=` or
                prompt lookup alone; `max_matching_ngram_size` without prompt lookup) or are out of range.
            `TypeError`: for an argument of the wrong type (a draft model that is not a transformers causal LM with an
                lm_head, `speculative_costs=` that is not a `SpeculativeCosts`, positional arguments after
                `generation_config` on a speculative call). docs/refusals.md lists each refusal with its message.
        """
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
