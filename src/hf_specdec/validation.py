"""Checks that a target and a draft can decode together, with errors that say what to do instead."""

from __future__ import annotations

from typing import Any

from transformers import GenerationConfig, PreTrainedModel

_SPECIAL_TOKENS = ("bos_token_id", "eos_token_id", "pad_token_id")


def output_vocab_size(model: PreTrainedModel) -> int:
    """Number of logits the model produces per position."""
    embeddings = model.get_output_embeddings()
    if embeddings is not None and hasattr(embeddings, "weight"):
        return int(embeddings.weight.shape[0])
    return int(model.config.get_text_config(decoder=True).vocab_size)


def check_models(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    tokenizer: Any = None,
    assistant_tokenizer: Any = None,
) -> None:
    """Raise `ValueError` when `draft` cannot draft for `target`.

    The two must be decoder-only causal LMs whose token ids mean the same thing. Vocabulary sizes may differ
    (models often pad their embedding matrix), provided both tokenizers are given and are identical.
    """
    for role, model in (("target", target), ("draft", draft)):
        if model.config.is_encoder_decoder:
            raise ValueError(
                f"The {role} ({type(model).__name__}) is an encoder-decoder model; speculative decoding here "
                "supports decoder-only causal LMs. Use transformers' `assistant_model=` for encoder-decoders."
            )
    if tokenizer is not None and assistant_tokenizer is not None:
        if tokenizer.get_vocab() != assistant_tokenizer.get_vocab():
            raise ValueError(
                "The target's and the draft's tokenizers have different vocabularies, so a drafted token id "
                "means something else to the target. Choose a draft trained with the target's tokenizer."
            )
        size = len(tokenizer)
        if size > min(output_vocab_size(target), output_vocab_size(draft)):
            raise ValueError(f"The tokenizer has {size} tokens, more than one of the models can score.")
        return
    if (tokenizer is None) != (assistant_tokenizer is None):
        raise ValueError("Pass both `tokenizer` and `assistant_tokenizer` to compare vocabularies, or neither.")
    target_size, draft_size = output_vocab_size(target), output_vocab_size(draft)
    if target_size != draft_size:
        raise ValueError(
            f"The target scores {target_size} tokens and the draft {draft_size}. If they share a tokenizer "
            "(embeddings padded to different sizes), pass `tokenizer=` and `assistant_tokenizer=` to "
            "`generate()` so the vocabularies can be checked and mapped; otherwise the draft cannot be used."
        )
    for name in _SPECIAL_TOKENS:
        mine, theirs = getattr(target.config, name, None), getattr(draft.config, name, None)
        if mine is not None and theirs is not None and mine != theirs:
            raise ValueError(
                f"The target's {name} is {mine} but the draft's is {theirs}: they likely use different "
                "tokenizers. If the vocabularies really are the same, pass `tokenizer=` and "
                "`assistant_tokenizer=` to `generate()` to have them compared."
            )


def check_generation_config(config: GenerationConfig) -> None:
    """Raise `ValueError` for generation settings speculative decoding does not support."""
    if (config.num_beams or 1) > 1:
        raise ValueError(
            f"Beam search (num_beams={config.num_beams}) cannot be combined with `assistant=`: speculative "
            "decoding verifies one continuation per row. Use num_beams=1 or drop `assistant=`."
        )
    if config.num_beam_groups is not None and config.num_beam_groups > 1:
        raise ValueError("Diverse beam search cannot be combined with `assistant=`.")
    if config.guidance_scale is not None and config.guidance_scale != 1:
        raise ValueError("Classifier-free guidance (guidance_scale) cannot be combined with `assistant=`.")
    unsupported = [
        name
        for name in ("output_attentions", "output_hidden_states", "output_scores", "output_logits")
        if getattr(config, name, False)
    ]
    if unsupported:
        raise ValueError(
            f"{unsupported} are not available with `assistant=` yet: the verification forward scores "
            "several tokens at once. Use `return_dict_in_generate=True` for the sequences and speculative "
            "statistics, or plain `generate()` for per-step outputs."
        )
