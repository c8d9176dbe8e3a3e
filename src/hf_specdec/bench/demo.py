"""Side by side: plain `generate()` against `generate(assistant=draft)` on real models and prompts."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

import hf_specdec
from hf_specdec.bench.prompts import chat_inputs
from hf_specdec.bench.runner import BF16_TIE_GAP, compare_to_plain, row_lengths
from hf_specdec.generation.validation import eos_token_ids
from hf_specdec.zoo import load_model

# One prompt: batch size 1, the latency case. Pass several --prompt for a batch.
DEFAULT_PROMPTS = ["Write a Python function that returns the n-th Fibonacci number, with a docstring."]


@dataclass
class Run:
    """One timed generation."""

    sequences: torch.Tensor
    seconds: float
    new_tokens: int
    stats: hf_specdec.SpeculativeStats | None = None

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds


def _count_new(sequences: torch.Tensor, prompt_length: int, pad_token_id: int | None) -> int:
    new = sequences[:, prompt_length:]
    return int((new != pad_token_id).sum()) if pad_token_id is not None else new.numel()


def timed_generate(model: PreTrainedModel, inputs: dict, pad: int | None, **kwargs: Any) -> Run:
    start = time.perf_counter()
    out = model.generate(**inputs, return_dict_in_generate=True, **kwargs)
    seconds = time.perf_counter() - start
    new = _count_new(out.sequences, inputs["input_ids"].shape[1], pad)
    return Run(out.sequences, seconds, new, getattr(out, "speculative", None))


def run_demo(
    target_name: str,
    draft_name: str,
    prompts: list[str],
    max_new_tokens: int,
    dtype: torch.dtype,
    num_assistant_tokens: int | None,
) -> bool:
    """Print both generations with their speed; returns whether the tokens were identical."""
    print(f"loading target {target_name} and draft {draft_name} ({dtype}) ...", flush=True)
    target, tokenizer = load_model(target_name, dtype=dtype)
    draft, _ = load_model(draft_name, dtype=dtype)
    hf_specdec.speculative(target)
    inputs = chat_inputs(tokenizer, prompts)
    pad = tokenizer.pad_token_id
    greedy = dict(max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad)
    spec = dict(greedy, assistant=draft)
    if num_assistant_tokens is not None:
        spec["num_assistant_tokens"] = num_assistant_tokens
    timed_generate(target, inputs, pad, **dict(greedy, max_new_tokens=4))  # warm-up
    plain = timed_generate(target, inputs, pad, **greedy)
    fast = timed_generate(target, inputs, pad, **spec)
    both = timed_generate(target, inputs, pad, **spec, prompt_lookup_num_tokens=10)
    prompt_length = inputs["input_ids"].shape[1]
    for title, run in (("plain generate()", plain), ("generate(assistant=draft)", fast)):
        print(f"\n=== {title}: {run.new_tokens} tokens in {run.seconds:.1f} s, {run.tokens_per_second:.1f} tokens/s")
        for row in run.sequences[:, prompt_length:]:
            print("---", tokenizer.decode(row, skip_special_tokens=True).strip())
    assert fast.stats is not None
    summary = fast.stats.summary()
    identical = torch.equal(plain.sequences, fast.sequences)
    print(
        f"\nspeedup {plain.seconds / fast.seconds:.2f}x, "
        f"{summary['tau']:.2f} tokens per target forward (accepted drafts + 1), "
        f"{summary['acceptance_rate']:.0%} of drafted tokens accepted, "
        f"identical tokens: {'yes' if identical else 'no'}"
    )
    if not identical:
        _explain_divergences(target, plain, fast, inputs)
    assert both.stats is not None
    both_identical = torch.equal(plain.sequences, both.sequences)
    print(
        f"with prompt lookup too (generate(assistant=draft, prompt_lookup_num_tokens=10)): "
        f"speedup {plain.seconds / both.seconds:.2f}x, {both.stats.lookup_steps} steps drafted by lookup, "
        f"identical tokens: {'yes' if both_identical else 'no'}"
    )
    if not both_identical:
        _explain_divergences(target, plain, both, inputs)
    return identical and both_identical


def _explain_divergences(target: PreTrainedModel, plain: Run, fast: Run, inputs: dict) -> None:
    """Say where the outputs part and whether it is a numerical tie (expected in bf16) or a real difference."""
    lengths = row_lengths(plain.sequences, inputs["input_ids"].shape[1], eos_token_ids(target))
    _, divergences = compare_to_plain(target, plain.sequences, fast.sequences, inputs, lengths)
    for d in divergences:
        gap = d["gap"]
        kind = "a numerical tie" if gap is not None and abs(gap) <= BF16_TIE_GAP else "NOT a tie: please report it"
        gap_text = "n/a" if gap is None else f"{gap:.3f}"
        print(
            f"row {d['row']}: first difference at generated token {d['position']}, the target's logit gap "
            f"between the two tokens is {gap_text}, {kind}. In bf16 a forward over several tokens rounds "
            "differently from one over a single token; in float32 (--dtype float32) the outputs are identical."
        )
