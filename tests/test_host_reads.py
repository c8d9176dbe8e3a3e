"""The host-read counter: what it counts as a read a GPU would wait for, and what it leaves alone."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from hf_specdec.bench.host_reads import count_host_reads


def test_each_kind_of_read_is_counted_once() -> None:
    x = torch.arange(6)
    with count_host_reads() as reads:
        x.sum().item()
        bool(x.any())
        int(x[0])
        x.tolist()
        x.nonzero()
        x[x > 2]
        x.unique()
    assert reads["item"] == reads["bool"] == reads["int"] == reads["tolist"] == 1
    assert reads["nonzero"] == 1 and reads["boolean mask indexing"] == 1 and sum(reads.values()) == 7


def test_device_work_alone_is_not_a_read() -> None:
    x = torch.randn(4, 8)
    with count_host_reads() as reads:
        y = torch.softmax(x @ x.T, dim=-1).argmax(dim=-1)
        torch.where(y > 1, y, 0).cumsum(0)
        x.masked_fill(x > 0, 0.0)
    assert sum(reads.values()) == 0


def test_other_threads_and_the_time_after_are_not_counted() -> None:
    x = torch.ones(3)
    with count_host_reads() as reads:
        thread = threading.Thread(target=lambda: x.sum().item())
        thread.start()
        thread.join()
    x.sum().item()
    assert sum(reads.values()) == 0


# --- the decoding loop reads the device a bounded number of times per step ---------------------------------------

# Reads a generate() call makes once, whatever its length (transformers' own preparation, the prefill, the
# first token, the output); the bound below allows these on top of the per-step ones.
PER_CALL = 16
NEW_TOKENS = 64


def _count_draft_forwards(module: torch.nn.Module) -> list[int]:
    calls = [0]
    module.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def _run(path: str, batch: int, free: bool = False) -> tuple[int, int, int]:
    """(host reads, steps, draft forwards) of one generation on `path` with fixed costs (nothing at all when
    `free`)."""
    from hf_specdec import MedusaConfig, MedusaForCausalLM, SpeculativeCosts
    from tests.tiny_models import ragged_batch, tiny_model, tiny_target

    ids, mask = ragged_batch(batch, seed=1)
    common = dict(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=NEW_TOKENS,
        do_sample=path.endswith("sampled"),
        return_dict_in_generate=True,
        # cheap: every step drafts, and the rules still weigh (free: nothing to weigh)
        speculative_costs=SpeculativeCosts(0.0, 0.0) if free else SpeculativeCosts(0.001, 0.001),
    )
    draft = tiny_model("llama", seed=0, num_layers=1, sharpen=4.0)
    forwards = _count_draft_forwards(draft)
    if path.startswith(("medusa", "eagle")):
        head_type = path.split()[0]
        model = MedusaForCausalLM.from_base(
            tiny_model("llama", seed=0, sharpen=4.0), MedusaConfig(num_heads=3, head_type=head_type)
        )
        forwards = _count_draft_forwards(model.heads.decoder if head_type != "medusa" else model.heads)
        lookup = {"prompt_lookup_num_tokens": 4} if path.endswith("lookup") else {}
        call = lambda: model.generate(**common, medusa=True, **lookup)  # noqa: E731
    else:
        target = tiny_target("llama")
        constant = dict(assistant=draft, num_assistant_tokens=4, num_assistant_tokens_schedule="constant")
        settings = {
            "assistant constant": constant,
            "assistant constant sampled": constant,
            "assistant adaptive": dict(assistant=draft),
            "draft tree": dict(assistant=draft, tree=8),
            "draft tree lookup": dict(assistant=draft, tree=8, prompt_lookup_num_tokens=4),
            "lookup": dict(prompt_lookup_num_tokens=4),
            "hybrid": dict(assistant=draft, prompt_lookup_num_tokens=4),
        }[path]
        call = lambda: target.generate(**common, **settings)  # noqa: E731
    call()  # warm: lazily built state is not what is measured
    forwards[0] = 0
    with count_host_reads() as reads:
        out = call()
    return sum(reads.values()), int(out.speculative.target_forwards.max()), forwards[0]


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize(
    "path",
    ["assistant constant", "assistant constant sampled", "lookup", "medusa", "medusa lookup"],
)
def test_a_step_reads_the_device_at_most_twice(path: str, batch: int) -> None:
    reads, steps, _ = _run(path, batch)
    assert steps > 10
    assert reads <= 2 * steps + PER_CALL, (reads, steps)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize(
    "path", ["assistant adaptive", "draft tree", "draft tree lookup", "hybrid", "eagle", "eagle lookup", "eagle3"]
)
def test_drafting_that_stops_on_what_it_drafted_reads_once_more_per_draft_forward(path: str, batch: int) -> None:
    reads, steps, draft_forwards = _run(path, batch)
    assert steps > 5 and draft_forwards > 0
    assert reads <= 2 * steps + draft_forwards + PER_CALL, (reads, steps, draft_forwards)


@pytest.mark.parametrize("path", ["assistant adaptive", "draft tree", "eagle", "eagle3"])
def test_drafting_that_costs_nothing_reads_nothing_to_decide_how_far_to_draft(path: str) -> None:
    """With free costs every depth pays whatever its gain: the rules answer without reading the gain."""
    reads, steps, draft_forwards = _run(path, 1, free=True)
    assert steps > 5 and draft_forwards > steps
    assert reads <= 2 * steps + PER_CALL, (reads, steps, draft_forwards)


def test_the_overhead_table_puts_plain_first_and_counts_per_step() -> None:
    from hf_specdec.bench.overhead import format_overhead, measure_overhead

    rows = measure_overhead(["assistant-constant", "lookup"], new_tokens=24, repeats=1)
    assert [row.path for row in rows] == ["plain", "assistant-constant", "lookup"]
    plain, constant, _ = rows
    assert plain.relative == 1.0 and plain.tokens_per_step == 1.0
    assert constant.tokens_per_step > 3.0  # a perfect draft of 4 tokens: up to 5 tokens per step
    assert constant.reads_per_step < plain.reads_per_step * 4
    assert format_overhead(rows).count("\n") == len(rows) + 1
    with pytest.raises(ValueError, match="Unknown overhead paths"):
        measure_overhead(["tree"])


# --- the host's operations around the forwards ---------------------------------------------------------------------


def test_operations_inside_forwards_and_other_threads_are_not_counted() -> None:
    from hf_specdec.bench.host_ops import count_host_ops

    layer = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with count_host_ops() as ops:
        layer(x)  # inside a forward
        thread = threading.Thread(target=lambda: (x + 1).sum())
        thread.start()
        thread.join()
        (x * 2).sum()  # two operations outside
    assert ops[0] == 2


def test_a_draft_models_chain_costs_the_host_at_most_half_again_plains_operations() -> None:
    """Per generated token, the operations a draft model's constant chain dispatches around its forwards (masks,
    bookkeeping, acceptance) stay within 1.5x those of plain `generate()`: a count, the machine-independent
    counterpart of host time (`hf-specdec overhead` prints both)."""
    from hf_specdec.bench.overhead import measure_overhead

    _, constant, adaptive, lookup = measure_overhead(
        ["assistant-constant", "assistant", "lookup"], new_tokens=128, repeats=1
    )
    assert constant.ops_relative <= 1.5, constant
    assert adaptive.ops_relative <= 1.5, adaptive
    assert lookup.ops_relative <= 1.5, lookup


# --- whole calls with the arguments users pass ----------------------------------------------------------------------

# The argument families of `GenerationConfig` that make the loop score prefixes or stop rows itself.
FAMILIES = {
    "lengths": dict(min_new_tokens=NEW_TOKENS),
    "stop strings": dict(stop_strings=["zz", "qqq"]),
    "eos list": dict(eos_token_id=[3, 5]),
    "processors": dict(repetition_penalty=1.3, bad_words_ids=[[7, 8]], min_length=30),
    "together": dict(min_new_tokens=NEW_TOKENS, stop_strings=["zz"], eos_token_id=[3, 5], repetition_penalty=1.3),
}
# Reads per target forward over a whole call (batch 1, a perfect draft): plain decoding reads about once.
BOUNDS = {"assistant constant": 2.2, "lookup": 2.2, "draft tree": 6.0, "medusa": 2.2}


def _whole_call(path: str, family: str, batch: int = 1, streamer: Any = None) -> tuple[int, int, torch.Tensor]:
    """(host reads, target forwards, sequences) of one greedy call on `path` with the `family`'s arguments: a tiny
    Llama, its exact twin as the draft (every draft accepted: the fewest forwards, so reads weigh the most)."""
    from hf_specdec import MedusaConfig, MedusaForCausalLM, SpeculativeCosts
    from tests.fuzz_cases import tokenizer
    from tests.tiny_models import ragged_batch, tiny_target

    ids, mask = ragged_batch(batch, seed=1)
    arguments = dict(FAMILIES[family])
    if "stop_strings" in arguments:
        arguments["tokenizer"] = tokenizer()
    target = tiny_target("llama")
    counted = target
    settings: dict[str, Any] = {
        "assistant constant": dict(
            assistant=tiny_target("llama"), num_assistant_tokens=4, num_assistant_tokens_schedule="constant"
        ),
        "lookup": dict(prompt_lookup_num_tokens=4),
        "draft tree": dict(assistant=tiny_target("llama"), tree=8),
        "medusa": dict(medusa=True),
        "plain": {},
    }[path]
    if path != "plain":  # fixed costs: every step drafts, whatever this machine's timings
        settings["speculative_costs"] = SpeculativeCosts(0.001, 0.001)
    if path == "medusa":
        target = MedusaForCausalLM.from_base(target, MedusaConfig(num_heads=3))
    forwards = _count_draft_forwards(counted)

    def call() -> Any:
        return target.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False, streamer=streamer,
            return_dict_in_generate=True, **arguments, **settings,
        )  # fmt: skip

    call()  # warm
    forwards[0] = 0
    with count_host_reads() as reads:
        out = call()
    return sum(reads.values()), forwards[0], out.sequences


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("path", list(BOUNDS))
def test_a_whole_call_reads_about_once_per_target_forward_whatever_the_arguments(path: str, family: str) -> None:
    reads, forwards, sequences = _whole_call(path, family)
    _, _, plain = _whole_call("plain", family)
    assert torch.equal(sequences, plain)  # the same tokens as plain decoding, with these arguments
    assert forwards >= 5
    assert reads <= BOUNDS[path] * forwards, (reads, forwards)


def test_a_streamer_costs_no_device_read() -> None:
    """Each step hands the streamer its tokens as a tensor built on the host from the step's one read, waiting
    for no device; the one read a streamer adds is the prompt `generate()` hands it once per call."""
    from transformers.generation.streamers import BaseStreamer

    class Recorder(BaseStreamer):
        def __init__(self) -> None:
            self.values: list[torch.Tensor] = []

        def put(self, value: torch.Tensor) -> None:
            self.values.append(value)

        def end(self) -> None:
            pass

    streamer = Recorder()
    with_streamer, forwards, _ = _whole_call("assistant constant", "together", streamer=streamer)
    without, _, _ = _whole_call("assistant constant", "together")
    assert with_streamer <= without + 1
    assert all(value.device.type == "cpu" for value in streamer.values) and len(streamer.values) > forwards
