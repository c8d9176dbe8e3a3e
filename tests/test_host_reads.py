"""The host-read counter: what it counts as a read a GPU would wait for, and what it leaves alone."""

from __future__ import annotations

import threading

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
