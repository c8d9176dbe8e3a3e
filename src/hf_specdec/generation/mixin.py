"""`SpeculativeGenerationMixin`: `generate(assistant=...)` and `generate(prompt_lookup_num_tokens=...)` on any
transformers causal LM, at any batch size.

Without speculative arguments `generate()` is transformers' own, untouched. With `assistant=` or
`prompt_lookup_num_tokens=`, transformers still prepares everything (generation config, processors, stopping
criteria, lengths, special tokens) and then hands the decoding loop to [`speculative_decode`] through its
public `custom_generate` hook.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel

from hf_specdec.drafters.decoding import speculative_decode
from hf_specdec.drafters.draft_length import SCHEDULES, DraftLengthPolicy
from hf_specdec.drafters.draft_tree import draft_tree_spec
from hf_specdec.drafters.lookup import PromptLookupDrafter
from hf_specdec.drafters.text_alignment import Tokenizers
from hf_specdec.drafters.vocab import check_token_ids
from hf_specdec.generation.arguments import (
    LOOKUP_SETTINGS,
    lookup_settings,
    passed,
    requested,
    with_stop_strings,
    withhold,
)
from hf_specdec.generation.decisions import SpeculativeCosts
from hf_specdec.generation.inputs import check_generate_arguments, check_generation_config_type
from hf_specdec.generation.validation import (
    check_models,
    check_other_tokenizer_settings,
    other_tokenizers,
    output_vocab_size,
)
from hf_specdec.trees.dynamic import DynamicTree

# Defaults measured with the benchmark (docs/benchmarks.md); a user's generation config overrides them.
DEFAULT_NUM_ASSISTANT_TOKENS = 8
DEFAULT_SCHEDULE = "adaptive"
DEFAULT_CONFIDENCE_THRESHOLD: float | None = None


class SpeculativeGenerationMixin:
    """Adds speculative decoding to `generate()`. Mix it in before the model's class, or use [`speculative`].

    Extra arguments of `generate()`:
        assistant (`PreTrainedModel`): a smaller causal LM with the target's vocabulary that drafts tokens (or
            of another vocabulary, with `tokenizer=` and `assistant_tokenizer=`: see below).
        num_assistant_tokens (`int`): tokens drafted per step; the most per step with "adaptive" (default 8).
        num_assistant_tokens_schedule (`str`): `"adaptive"` (default: stop drafting when another draft forward
            is expected to bring less than its cost times the tokens per plain step recent steps brought),
            `"constant"` or `"heuristic"`.
        assistant_confidence_threshold (`float`): stop drafting once the draft's top probability falls below
            this in every row (default: off).
        tree (`DynamicTree` or `int`): with `assistant=`, the draft model grows a tree per row and step instead of a
            chain (EAGLE-2-style: `top_k` children per frontier node, the best `num_nodes` verified in one target
            forward; an int is a number of nodes with the default shape). With prompt lookup too, each row's
            looked-up continuation is grafted onto its tree. `num_assistant_tokens_schedule="constant"` grows and
            verifies the whole tree at every step (default "adaptive": as far as it pays).
        assistant_vocab (`torch.LongTensor` or list of ids): a draft vocabulary, e.g. the most frequent tokens
            (`hf_specdec.drafters.vocab.draft_vocabulary`): the draft proposes only these tokens and skips the
            rest of its lm_head, which makes each draft forward cheaper on large vocabularies. Lossless: the target
            still verifies every token over its full vocabulary (default: the draft's whole vocabulary).
        prompt_lookup_num_tokens (`int`): draft by prompt lookup: each row proposes up to this many tokens that
            followed its last n-gram where it last occurred in the row (prompt or generated text). Alone, no draft
            model runs; with `assistant=` too, each step drafts with whichever of the two is expected to commit
            more tokens per unit of cost. Lossless, at any batch size. With the "adaptive" schedule (default)
            fewer are proposed when the measured acceptance at later positions does not pay for verifying them;
            `num_assistant_tokens_schedule="constant"` always proposes this many.
        max_matching_ngram_size (`int`): the longest n-gram prompt lookup matches (default 3).
        With both `assistant=` and prompt lookup, `num_assistant_tokens_schedule` applies to the draft model, and
        the lookup is adaptive unless the schedule is `"constant"`.
        generator (`torch.Generator`): randomness for sampling (default: torch's global generator).
        speculative_costs (`SpeculativeCosts`): fixed costs of a draft forward and of verifying one more token,
            instead of timings measured while decoding (e.g. `out.speculative.costs` of an earlier run). Draft
            lengths and the hybrid's choice then depend on the tokens alone, so sampling with a seeded
            `generator` is bitwise reproducible on a fixed machine.
        tokenizer / assistant_tokenizer: the target's and the draft's tokenizers. Where their vocabularies
            differ, the draft reads the text in its own tokens and its drafts are re-encoded as target tokens
            (`hf_specdec.drafters.translated`: greedy stays token-identical to plain greedy; sampling proposes only
            the tokens both vocabularies share and keeps the target's distribution exactly; chains only, without
            prompt lookup or `assistant_vocab`). Where they are the same, they let vocabulary sizes differ.
            `tokenizer` is also needed for `stop_strings`.
    """

    def generate(
        self,
        inputs: torch.Tensor | None = None,
        generation_config: GenerationConfig | None = None,
        *args: Any,
        assistant: PreTrainedModel | None = None,
        assistant_vocab: torch.Tensor | Sequence[int] | None = None,
        tree: DynamicTree | int | None = None,
        **kwargs: Any,
    ) -> Any:
        if generation_config is not None and not isinstance(generation_config, GenerationConfig):
            speculative_call = any(x is not None for x in (assistant, tree, assistant_vocab))
            if not speculative_call and not kwargs.get("prompt_lookup_num_tokens"):  # plain generate()'s own error
                return super().generate(inputs, generation_config, *args, **kwargs)  # type: ignore[misc]
            check_generation_config_type(generation_config)
        lookup_tokens = requested(self, generation_config, kwargs, "prompt_lookup_num_tokens")  # type: ignore[arg-type]
        if assistant is None and assistant_vocab is not None:
            raise ValueError("`assistant_vocab` restricts the draft of `assistant=`: pass a draft model too.")
        if assistant is None and tree is not None:
            raise ValueError(
                "`tree=` is the tree a draft model grows: pass `assistant=` too (Medusa heads take "
                "`tree=` in MedusaForCausalLM.generate(medusa=True))."
            )
        if assistant is None and lookup_tokens is None:
            return super().generate(inputs, generation_config, *args, **kwargs)  # type: ignore[misc]
        path = "`assistant=`" if assistant is not None else "prompt lookup"
        if args:
            raise TypeError(f"Pass generate()'s arguments after `generation_config` by keyword with {path}.")
        check_generate_arguments(self, inputs, kwargs, path)  # type: ignore[arg-type]
        self._check_speculative_kwargs(kwargs, path)
        tokenizers = None
        if assistant is not None:
            assistant = as_draft_model(assistant)
            tokenizer, assistant_tokenizer = kwargs.get("tokenizer"), kwargs.pop("assistant_tokenizer", None)
            check_models(self, assistant, tokenizer, assistant_tokenizer)  # type: ignore[arg-type]
            if other_tokenizers(tokenizer, assistant_tokenizer):  # the draft drafts through text
                check_other_tokenizer_settings(tree, assistant_vocab, lookup_tokens)
                tokenizers = Tokenizers(tokenizer, assistant_tokenizer)
        if assistant_vocab is not None:
            assert assistant is not None
            assistant_vocab = check_token_ids(
                torch.as_tensor(assistant_vocab),
                min(output_vocab_size(self), output_vocab_size(assistant)),  # type: ignore[arg-type]
                "`assistant_vocab`",
            )
        costs = kwargs.pop("speculative_costs", None)
        if costs is not None and not isinstance(costs, SpeculativeCosts):
            raise TypeError(f"speculative_costs takes a hf_specdec.SpeculativeCosts, got {type(costs).__name__}.")
        lookup = lookup_settings(self, generation_config, kwargs)  # type: ignore[arg-type]
        schedule = _pick(requested(self, generation_config, kwargs, "num_assistant_tokens_schedule"), DEFAULT_SCHEDULE)  # type: ignore[arg-type]
        if schedule not in SCHEDULES:
            raise ValueError(f"num_assistant_tokens_schedule must be one of {SCHEDULES}, got {schedule!r}.")
        policy = self._draft_length_policy(generation_config, kwargs, assistant, schedule)
        for name in ("num_assistant_tokens", "assistant_confidence_threshold"):
            if tree is not None and passed(generation_config, kwargs, name):  # type: ignore[arg-type]
                raise ValueError(f"`{name}` sets a draft chain's length; with `tree=` the DynamicTree sets the shape.")
        if tree is not None and schedule == "heuristic":
            raise ValueError(
                "num_assistant_tokens_schedule='heuristic' grows and shrinks a draft chain; with `tree=` take "
                "'adaptive' (default: the tree grows and is verified as far as it pays) or 'constant' (the whole "
                "tree at every step)."
            )
        prompt_lookup = None
        if lookup is not None:
            prompt_lookup = PromptLookupDrafter(
                lookup.num_tokens, lookup.max_ngram_size, adaptive=schedule != "constant"
            )
        generation_config, kwargs = withhold(self, generation_config, kwargs, LOOKUP_SETTINGS)  # type: ignore[arg-type]
        generation_config, kwargs = with_stop_strings(self, generation_config, kwargs)  # type: ignore[arg-type]
        decode = functools.partial(
            speculative_decode,
            assistant=assistant,
            prompt_lookup=prompt_lookup,
            draft_length=policy,
            costs=costs,
            assistant_vocab=assistant_vocab,
            tree=None if tree is None else draft_tree_spec(tree),
            tokenizers=tokenizers,
            streamer=kwargs.get("streamer"),
        )
        return super().generate(inputs, generation_config, custom_generate=decode, **kwargs)  # type: ignore[misc]

    def _draft_length_policy(
        self,
        generation_config: GenerationConfig | None,
        kwargs: dict[str, Any],
        assistant: PreTrainedModel | None,
        schedule: str,
    ) -> DraftLengthPolicy | None:
        """The draft model's length schedule from `num_assistant_tokens*` and `assistant_confidence_threshold`
        (our measured defaults where unset); `None` without a draft model, whose settings are then refused."""
        if assistant is None:
            for name in ("num_assistant_tokens", "assistant_confidence_threshold"):
                if passed(generation_config, kwargs, name):
                    raise ValueError(
                        f"`{name}` tunes the draft model of `assistant=`; prompt lookup drafts up to "
                        "`prompt_lookup_num_tokens` tokens per step. Drop it."
                    )
            if schedule == "heuristic":
                raise ValueError(
                    "num_assistant_tokens_schedule='heuristic' follows a draft model's acceptance; prompt lookup "
                    "takes 'adaptive' (default) or 'constant'."
                )
            return None

        def setting(name: str) -> Any:
            return requested(self, generation_config, kwargs, name)  # type: ignore[arg-type]

        return DraftLengthPolicy(
            num_tokens=_pick(setting("num_assistant_tokens"), DEFAULT_NUM_ASSISTANT_TOKENS),
            schedule=schedule,
            confidence_threshold=_pick(setting("assistant_confidence_threshold"), DEFAULT_CONFIDENCE_THRESHOLD),
        )

    @staticmethod
    def _check_speculative_kwargs(kwargs: dict[str, Any], path: str) -> None:
        clashes = {
            "assistant_model": "pass the draft as `assistant=` (`assistant_model=` is transformers' own path)",
            "custom_generate": f"`custom_generate` replaces the decoding loop that {path} provides",
            "negative_prompt_ids": "classifier-free guidance is not supported with speculative decoding",
        }
        for name, why in clashes.items():
            if kwargs.get(name) is not None:
                raise ValueError(f"`{name}` cannot be combined with {path}: {why}.")


def _pick(value: Any, default: Any) -> Any:
    """A speculative setting from the user's generation config or `generate()` kwargs, else our default."""
    return default if value is None else value


def as_draft_model(assistant: Any) -> PreTrainedModel:
    """The causal LM to draft with, from what `assistant=` received: a transformers causal LM with its
    language-model head, or a PEFT model around one whose adapters live in its layers (LoRA and the like:
    the wrapped model, adapters active, drafts)."""
    try:
        from peft import PeftModel
    except ImportError:  # peft is optional: without it no PEFT model can be passed
        PeftModel = None
    if PeftModel is not None and isinstance(assistant, PeftModel):
        if assistant.active_peft_config.is_prompt_learning:
            raise ValueError(
                "`assistant=` is a PEFT model with a prompt-learning adapter (prefix or prompt tuning), which adds "
                "virtual tokens to every forward and cannot be rolled back with the draft's cache. Merge or drop "
                "the adapter, or pass a draft without it."
            )
        assistant = assistant.get_base_model()
    if not isinstance(assistant, PreTrainedModel):
        raise TypeError(
            f"`assistant=` takes a transformers causal LM (e.g. `AutoModelForCausalLM.from_pretrained(...)`), got "
            f"{type(assistant).__name__}."
        )
    if assistant.get_output_embeddings() is None:
        raise TypeError(
            f"`assistant=` got {type(assistant).__name__}, which has no language-model head to score tokens with. "
            "Load the draft with `AutoModelForCausalLM.from_pretrained(...)` instead of `AutoModel`."
        )
    return assistant


def _rebuild_speculative(cls: type, state: dict[str, Any]) -> PreTrainedModel:
    """Unpickle a model that `speculative()` had given speculative `generate()`: its original class, its state,
    then `speculative()` again."""
    model = cls.__new__(cls)
    model.__setstate__(state)
    return speculative(model)


def _reduce_speculative(self: PreTrainedModel, protocol: int) -> tuple[Any, ...]:
    # The class `speculative()` makes is built at run time and cannot be found by name when unpickling: pickle
    # the model as its original class and rebuild the speculative class on load.
    return _rebuild_speculative, (type(self).__mro__[2], self.__getstate__())


@functools.cache
def _speculative_class(cls: type) -> type:
    # Keep the original name so `save_pretrained` records the usual architecture.
    namespace = {"__module__": cls.__module__, "__reduce_ex__": _reduce_speculative}
    return type(cls.__name__, (SpeculativeGenerationMixin, cls), namespace)


def speculative(model: PreTrainedModel) -> PreTrainedModel:
    """Give `model` speculative `generate()`: the same object, its class now mixing in
    [`SpeculativeGenerationMixin`]. Returns the model for chaining."""
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"speculative() takes a transformers PreTrainedModel, got {type(model).__name__}.")
    if not isinstance(model, SpeculativeGenerationMixin):
        model.__class__ = _speculative_class(type(model))
    return model
