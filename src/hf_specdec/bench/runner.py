"""Run the methods on the prompts, interleaved batch by batch, and record what each did."""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import CompileConfig, GenerationMixin, PreTrainedModel, PreTrainedTokenizerBase

from hf_specdec.bench.markdown import call_text
from hf_specdec.bench.methods import Method
from hf_specdec.bench.prompts import Prompt, chat_inputs
from hf_specdec.bench.report import BenchmarkResult, Sample
from hf_specdec.generation.decisions import SpeculativeCosts
from hf_specdec.generation.kv_cache import static_slots
from hf_specdec.generation.validation import eos_token_ids

# A bf16 forward over several tokens rounds differently from one over a single token; a divergence from
# plain greedy at a logit gap below this is a numerical tie, above it a bug (docs/benchmarks.md).
BF16_TIE_GAP = 0.25


def row_lengths(sequences: torch.Tensor, prompt_length: int, eos: list[int]) -> list[int]:
    """New tokens per row: up to and including the first EOS, else all of them."""
    generated = sequences[:, prompt_length:]
    lengths = []
    for row in generated:
        is_eos = (
            torch.isin(row, torch.tensor(eos, device=row.device)) if eos else torch.zeros_like(row, dtype=torch.bool)
        )
        hits = is_eos.nonzero()
        lengths.append(int(hits[0]) + 1 if hits.numel() else row.numel())
    return lengths


@torch.no_grad()
def _logit_gap(model: PreTrainedModel, reference: torch.Tensor, mask: torch.Tensor, position: int, other: int) -> float:
    """The target's logit of the reference token minus that of `other`, at `position` of the reference row."""
    logits = model(input_ids=reference[None, :position], attention_mask=mask[None, :position]).logits[0, -1].float()
    return float(logits[reference[position]] - logits[other])


def compare_to_plain(
    model: PreTrainedModel,
    plain: torch.Tensor,
    out: torch.Tensor,
    inputs: dict[str, torch.Tensor],
    lengths: list[int],
) -> tuple[list[bool], list[dict[str, Any]]]:
    """Per row, whether `out` equals plain greedy's tokens; for each row that does not, the first differing
    position and the target's logit gap there (plain's token minus the other; a bf16 tie when small)."""
    prompt_length = inputs["input_ids"].shape[1]
    matches, divergences = [], []
    for row, length in enumerate(lengths):
        a, b = plain[row, prompt_length : prompt_length + length], out[row, prompt_length : prompt_length + length]
        same = a.shape == b.shape and torch.equal(a, b)
        matches.append(same)
        if same:
            continue
        width = min(a.numel(), b.numel())
        differs = (a[:width] != b[:width]).nonzero()
        first = int(differs[0]) if differs.numel() else width
        if first >= width:  # one stopped earlier; nothing to compare token against token
            divergences.append({"row": row, "position": first, "gap": None})
            continue
        full_mask = torch.ones_like(plain[row])
        full_mask[:prompt_length] = inputs["attention_mask"][row]
        gap = _logit_gap(model, plain[row], full_mask, prompt_length + first, int(b[first]))
        divergences.append({"row": row, "position": first, "gap": gap, "tie": abs(gap) <= BF16_TIE_GAP})
    return matches, divergences


@dataclass
class _Contestants:
    """The models a benchmark's methods decode with: the target, the draft model (and its int8 copy, its draft
    vocabulary), Medusa heads and other heads by name."""

    target: PreTrainedModel
    draft: PreTrainedModel | None = None
    medusa: Any = None
    heads: dict[str, Any] | None = None
    draft_vocab: torch.Tensor | None = None
    draft_int8: PreTrainedModel | None = None


def _run_method(
    method: Method, models: _Contestants, inputs: dict[str, torch.Tensor], generate_kwargs: dict[str, Any]
) -> tuple[torch.Tensor, float, Any, int | None]:
    """One timed call of `method`: its sequences, seconds, speculative statistics (or `None`) and peak memory
    (CUDA only)."""
    target = models.target
    kwargs = {**generate_kwargs, **method.generate_kwargs(models.draft, models.draft_vocab, models.draft_int8)}
    speculative = method.speculative
    if speculative:
        kwargs["return_dict_in_generate"] = True
    model = target
    if method.uses == "medusa":
        model = models.medusa if method.heads is None else (models.heads or {})[method.heads]
    # Transformers' own methods: its generate(), past this library's mixin (which serves their arguments).
    generate = functools.partial(GenerationMixin.generate, model) if method.uses.startswith("hf-") else model.generate
    if target.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(target.device)
        torch.cuda.synchronize(target.device)
    start = time.perf_counter()
    out = generate(**inputs, **kwargs)
    if target.device.type == "cuda":
        torch.cuda.synchronize(target.device)
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(target.device) if target.device.type == "cuda" else None
    if speculative:
        return out.sequences, seconds, out.speculative, peak
    return out, seconds, None, peak


def run_benchmark(
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[Prompt],
    methods: list[Method],
    draft: PreTrainedModel | None = None,
    batch_size: int = 1,
    max_new_tokens: int = 96,
    do_sample: bool = False,
    seed: int = 0,
    medusa: Any = None,
    draft_vocab: torch.Tensor | None = None,
    compile: bool = False,
    heads: dict[str, Any] | None = None,
    repeats: int = 1,
) -> BenchmarkResult:
    """Run every method on every batch of prompts, in an order that rotates from batch to batch; with `repeats`,
    every method `repeats` times per batch (all of them once, then again), each timed by its median call.

    The first method must be `plain`: the others are compared to its outputs (greedy) and its speed.
    `medusa` is a `MedusaForCausalLM` on the same target, for the Medusa methods, and `heads` others by name, for
    the methods of named heads (`eagle3-8` decodes with `heads["eagle3"]`); `draft_vocab` the draft
    vocabulary of the methods that restrict their draft's (built from ShareGPT V3 when they run and it is `None`).
    The int8 draft of the `specdec-int8` methods is made from `draft` when they run (on a CPU only).
    With `compile`, every method runs with `cache_implementation="static"` and a `compile_config` (transformers'
    default; on a CPU told to compile there, without CUDA graphs), plain decoding included; the warm-up then
    runs every batch at its whole length, so that compiling happens before anything is timed.
    """
    if not methods or methods[0].uses != "plain":
        raise ValueError("The first method must be plain generate(): the others are measured against it.")
    if repeats < 1:
        raise ValueError(f"repeats is how many times each method runs per batch, at least 1: got {repeats}.")
    result = BenchmarkResult(
        settings={"batch_size": batch_size, "max_new_tokens": max_new_tokens, "do_sample": do_sample, "seed": seed}
    )
    if repeats > 1:
        result.settings["repeats"] = repeats
    runnable = _runnable(methods, result, batch_size, draft, medusa, heads, compile)
    models = _contestants(runnable, result, target, tokenizer, draft, medusa, heads, draft_vocab)
    generate_kwargs = {"max_new_tokens": max_new_tokens, "do_sample": do_sample, "pad_token_id": tokenizer.pad_token_id}
    batches = [prompts[i : i + batch_size] for i in range(0, len(prompts), batch_size)]
    if compile:
        generate_kwargs.update(_compiled(target, tokenizer, batches, max_new_tokens))
        result.settings["compiled"] = True
    # Warm-up: first calls pay for allocations and lazy initialisation; compiled, every batch is run once at its
    # whole length first, so that every width a method feeds is compiled before anything is timed. Drafting is
    # free there, so that every drafter runs (a draft model starts only where it is expected to pay).
    warm_kwargs = generate_kwargs if compile else {**generate_kwargs, "max_new_tokens": 4}
    free = {"speculative_costs": SpeculativeCosts(0.0, 0.0)}
    for batch in batches if compile else batches[:1]:
        warm = {k: v.to(target.device) for k, v in chat_inputs(tokenizer, [p.text for p in batch]).items()}
        for method in runnable:
            drafts = method.speculative and "speculative_costs" not in method.kwargs
            _run_method(method, models, warm, {**warm_kwargs, **free} if drafts else warm_kwargs)
    eos = eos_token_ids(target)
    for index, batch in enumerate(tqdm(batches, desc="benchmark", unit="batch")):
        inputs = {k: v.to(target.device) for k, v in chat_inputs(tokenizer, [p.text for p in batch]).items()}
        order = runnable[index % len(runnable) :] + runnable[: index % len(runnable)]
        outputs: dict[str, tuple] = {}
        seconds: dict[str, list[float]] = {method.name: [] for method in runnable}
        for repeat in range(repeats):  # every method once, then again: a drift of the machine hits all alike
            for method in order:
                torch.manual_seed(seed + index)
                out = _run_method(method, models, inputs, generate_kwargs)
                seconds[method.name].append(out[1])
                if repeat == 0:
                    outputs[method.name] = out
        for name, times in seconds.items():  # the median call: one slow call of a noisy machine does not count
            outputs[name] = (outputs[name][0], statistics.median(times), *outputs[name][2:])
        plain = outputs[runnable[0].name][0]
        for method in runnable:
            sample = _sample(method, index, batch, inputs, outputs[method.name], eos)
            if not do_sample and method is not runnable[0]:
                sequences, lengths = outputs[method.name][0], sample.new_tokens
                sample.matches_plain, sample.divergences = compare_to_plain(target, plain, sequences, inputs, lengths)
            result.samples.append(sample)
    return result


def _runnable(
    methods: list[Method],
    result: BenchmarkResult,
    batch_size: int,
    draft: PreTrainedModel | None,
    medusa: Any,
    heads: dict[str, Any] | None,
    compile: bool,
) -> list[Method]:
    """The methods this run can time; the others go to `result.skipped`, each with its reason."""
    runnable = []
    for method in methods:
        reason = method.skip_reason(batch_size, draft is not None, medusa is not None, list(heads or {}))
        if reason is None and compile and method.uses.startswith("hf-"):
            reason = "--compile: transformers' assisted generation and prompt lookup keep a dynamic cache"
        if reason is None and method.needs_int8_draft and draft is not None and draft.device.type != "cpu":
            reason = "the int8 draft (torch's dynamic quantisation) runs on CPUs only"
        if reason is None:
            runnable.append(method)
        else:
            result.skipped[method.name] = reason
    result.settings["arguments"] = {method.name: call_text(method) for method in runnable}
    return runnable


def _contestants(
    runnable: list[Method],
    result: BenchmarkResult,
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    draft: PreTrainedModel | None,
    medusa: Any,
    heads: dict[str, Any] | None,
    draft_vocab: torch.Tensor | None,
) -> _Contestants:
    """The models the runnable methods need, the draft vocabulary and the int8 draft made when one needs them."""
    if draft_vocab is None and any(method.needs_draft_vocab for method in runnable):
        from hf_specdec.bench.vocabulary import sharegpt_draft_vocabulary

        draft_vocab = sharegpt_draft_vocabulary(tokenizer)
    if draft_vocab is not None:
        result.settings["draft_vocab_size"] = draft_vocab.numel()
    draft_int8 = None
    if draft is not None and any(method.needs_int8_draft for method in runnable):
        from hf_specdec.bench.quantized import int8_draft

        draft_int8 = int8_draft(draft)
    return _Contestants(target, draft, medusa, heads, draft_vocab, draft_int8)


def _compiled(
    target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, batches: list[list[Prompt]], max_new_tokens: int
) -> dict[str, Any]:
    """`generate()`'s arguments for compiled decoding: one static cache size for every call, plain's and the
    methods' alike (a compiled forward recompiles for another)."""
    longest = max(chat_inputs(tokenizer, [p.text for p in batch])["input_ids"].shape[1] for batch in batches)
    return {
        "cache_implementation": "static",
        "compile_config": compile_config_for(target.device),
        "max_cache_len": static_slots(longest + max_new_tokens),
    }


def _sample(
    method: Method,
    index: int,
    batch: list[Prompt],
    inputs: dict[str, torch.Tensor],
    output: tuple[torch.Tensor, float, Any, int | None],
    eos: list[int],
) -> Sample:
    """One method's sample on one batch: its time, lengths, peak memory and speculative statistics."""
    sequences, seconds, stats, peak = output
    lengths = row_lengths(sequences, inputs["input_ids"].shape[1], eos)
    forwards = list(lengths) if method.uses == "plain" else []  # plain: one forward per token
    sample = Sample(method.name, index, [p.category for p in batch], seconds, lengths, forwards)
    sample.peak_memory_bytes = peak
    if stats is not None:
        sample.target_forwards = [int(x) + 1 for x in stats.target_forwards]  # + the prefill
        sample.accepted_tokens = stats.accepted_tokens.tolist()
        sample.drafted_at_position = stats.drafted_at_position.tolist()
        sample.accepted_at_position = stats.accepted_at_position.tolist()
        sample.draft_seconds, sample.verify_seconds = stats.draft_seconds, stats.verify_seconds
    return sample


def compile_config_for(device: torch.device) -> CompileConfig:
    """transformers' default `CompileConfig`; on a CPU without CUDA graphs and told to compile there."""
    config = CompileConfig()
    if device.type != "cuda":
        config.mode = "default"
        config._compile_all_devices = True
    return config
