"""The speculative decoding loop: draft, verify, accept, commit, for every drafter.

`decode` is handed to transformers' `generate()` as its decoding method (through its `custom_generate` hook),
after `generate()` has prepared the inputs, the generation config, the logits processors and the stopping
criteria exactly as for plain decoding. Each step a drafter proposes a tree per row rooted at the row's last
committed token (a chain is a tree of width one: a draft model, prompt lookup; Medusa heads grow real trees);
the target scores every node in one forward under the trees' attention mask; an acceptance rule keeps the
deepest node whose path the target agrees with (greedy: token-identical to plain greedy decoding; sampling:
the target's distribution exactly) and adds one token of the target's own; the path is committed to the
tokens, the target's KV cache and the drafter. Every row of the batch runs its own acceptance; finished rows
leave the batch.

The loop knows drafters only through their protocol (`hf_specdec.generation.drafter`): draft models and prompt lookup
enter through `hf_specdec.drafters.decoding.speculative_decode` (`generate(assistant=... |
prompt_lookup_num_tokens=...)`), Medusa and EAGLE heads through `hf_specdec.medusa.decoding.medusa_decode`, a
model's own multi-token-prediction layers through `hf_specdec.mtp.decoding.mtp_decode`
(`generate(use_mtp=True)`).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from hf_specdec.generation.continuation import Continuation
from hf_specdec.generation.decisions import CostModel
from hf_specdec.generation.drafter import DrafterFactory
from hf_specdec.generation.inputs import check_prompts
from hf_specdec.generation.outputs import SpeculativeDecoderOnlyOutput
from hf_specdec.generation.positions import check_position_limits
from hf_specdec.generation.recurrent import has_recurrent_layers as recurrent
from hf_specdec.generation.run import AcceptanceRule, DecodingRun
from hf_specdec.generation.validation import check_generation_config

ACCEPTANCE = ("exact", "typical")


@torch.no_grad()
def decode(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    *,
    make_drafter: DrafterFactory,
    costs: CostModel,
    path: str,
    plain_steps: bool = True,
    acceptance: str = "exact",
    typical_epsilon: float = 0.09,
    typical_delta: float = 0.3,
    streamer: BaseStreamer | None = None,
    generator: torch.Generator | None = None,
    continue_cache: bool = False,
    ensemble_weight: float | None = None,
    **model_kwargs: Any,
) -> torch.Tensor | SpeculativeDecoderOnlyOutput:
    """The speculative decoding loop, for any drafter.

    Args:
        model (`PreTrainedModel`): the target.
        input_ids (`torch.LongTensor` of shape `(batch, prompt)`): left-padded prompts.
        logits_processor, stopping_criteria, generation_config: as prepared by `generate()`.
        make_drafter (`DrafterFactory`): builds the drafter once the loop knows its processors and sizes.
        costs (`CostModel`): the decision model's costs (`hf_specdec.generation.decisions`), measured after
            every step (or fixed); every adaptive decision of the loop and its drafter weighs them.
        path (`str`): how error messages name the speculative path the user chose.
        plain_steps (`bool`): take plain one-token steps where drafting is not expected to pay
            (`SpeculationGate`); otherwise draft at every step.
        acceptance (`str`): `"exact"` (greedy identity, or the target's exact distribution when sampling) or
            `"typical"` (Medusa's typical acceptance when sampling: faster, **lossy**).
        typical_epsilon, typical_delta: the typical acceptance's threshold and entropy factor.
        streamer (`BaseStreamer`, *optional*): receives the tokens as plain decoding puts them: `(batch,)` per position.
        generator (`torch.Generator`, *optional*): randomness for sampling, for reproducible runs.
        continue_cache (`bool`): whether `model_kwargs["cache"]` is the caller's (`cache=` / `past_key_values=`):
            the loop continues from it and leaves it as plain decoding would (`Continuation`). Otherwise the cache
            `generate()` prepared is filled only at batch size 1 with `return_dict_in_generate=True` (it is then
            the output's `cache`).
        ensemble_weight (`float`, *optional*): sampling only, **lossy**: verify drafts against this mix of the
            target's and the draft's distributions (`AcceptanceRule`; transformers' `assistant_ensemble_weight`).
        model_kwargs: `attention_mask` `(batch, prompt)`, 0 on left padding (`None` when there is none), and
            `cache`; the positions `generate()` prepared are ignored, anything else is refused.

    Returns:
        `torch.LongTensor` `(batch, prompt + new)` on the device of `input_ids`, or a
        `SpeculativeDecoderOnlyOutput` when `return_dict_in_generate=True`.
    """
    check_generation_config(generation_config, per_token_scores=True, path=path)
    _check_acceptance(generation_config, acceptance, ensemble_weight)
    attention_mask = model_kwargs.pop("attention_mask", None)
    cache = model_kwargs.pop("cache", None)
    reject_model_kwargs(model_kwargs)
    check_prompts(model, input_ids, attention_mask)
    check_position_limits(model, generation_config.max_length)
    input_device = input_ids.device
    input_ids = input_ids.to(device=model.device, dtype=torch.long)  # plain generate() takes any integer ids
    attention_mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(model.device)
    continuation = None
    # A model with recurrent layers returns no cache (`out.cache` is None): its states are rolled back row by row
    # in a cache of the loop's own, which plain decoding could not continue.
    fill_output = input_ids.shape[0] == 1 and generation_config.return_dict_in_generate and not recurrent(model)
    if cache is not None and continue_cache and recurrent(model):
        raise ValueError(
            f"{type(model).__name__} keeps recurrent states, and {path} cannot continue a cache of them: call "
            "without `cache=` (the whole text is then prefilled), or continue this cache with plain `generate()`."
        )
    if cache is not None and (continue_cache or fill_output):
        continuation = Continuation(cache, input_ids, attention_mask, path)
    accept = AcceptanceRule(
        bool(generation_config.do_sample), acceptance == "typical", typical_epsilon, typical_delta, generator,
        ensemble_weight,
    )  # fmt: skip
    run = DecodingRun(
        model, input_ids, attention_mask, logits_processor, stopping_criteria, generation_config, make_drafter,
        costs, plain_steps, generator, continuation,
    )  # fmt: skip
    run.prefill(input_ids, attention_mask, streamer)
    while run.next_step():
        proposal = run.draft()
        verified = run.verify(proposal)
        accepted = accept(proposal, verified.scores)
        run.commit(proposal, verified, accepted)
    return run.finish(input_device)


_IGNORED_KWARGS = {"use_cache", "position_ids", "logits_to_keep"}


def reject_model_kwargs(model_kwargs: dict[str, Any]) -> None:
    """Model inputs other than token ids and a padding mask cannot be carried through speculative steps
    (the cache and positions `generate()` prepared are replaced by ours)."""
    unsupported = sorted(k for k, v in model_kwargs.items() if k not in _IGNORED_KWARGS and v is not None)
    if unsupported:
        raise ValueError(
            f"Speculative decoding takes `input_ids` and `attention_mask` only; got {unsupported}. "
            "Run plain `generate()` (without `assistant=` or `medusa=True`) for these inputs."
        )


def _check_acceptance(generation_config: GenerationConfig, acceptance: str, ensemble_weight: float | None) -> None:
    """The acceptance rule asked for, against the call's decoding: the lossy rules are sampling rules."""
    if acceptance not in ACCEPTANCE:
        raise ValueError(f"acceptance must be one of {ACCEPTANCE}, got {acceptance!r}.")
    if acceptance == "typical" and not generation_config.do_sample:
        raise ValueError("Typical acceptance is a sampling rule: pass do_sample=True, or use the exact rule.")
    if ensemble_weight is not None and not generation_config.do_sample:
        raise ValueError(
            "`assistant_ensemble_weight` mixes the draft's distribution into the target's when sampling: pass "
            "do_sample=True, or drop it (greedy speculative decoding already returns plain greedy's tokens)."
        )
