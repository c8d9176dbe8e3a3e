"""The benchmark machinery on tiny models (the real figures come from `hf-specdec bench`, see docs/benchmarks.md)."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import PreTrainedTokenizerFast

from hf_specdec.bench import METHODS, Prompt, load_prompts, method_by_name, run_benchmark
from hf_specdec.bench.cost_curve import verify_cost_curve
from hf_specdec.bench.report import format_table, write_outputs
from tests.tiny_models import PAD, VOCAB, tiny_model, tiny_target


def _tokenizer() -> PreTrainedTokenizerFast:
    backend = Tokenizer(WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t2"))
    backend.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="t0", eos_token="t3", padding_side="left")


PROMPTS = [
    Prompt("code", "t5 t9 t14 t20 t33", "a"),
    Prompt("chat", "t7 t8", "b"),
    Prompt("code", "t40 t41 t42", "c"),
    Prompt("math", "t50 t60 t70 t80", "d"),
]


def test_heads_given_names_run_side_by_side_in_one_run() -> None:
    from hf_specdec import DynamicTree, MedusaConfig, MedusaForCausalLM

    target = tiny_target("llama")
    heads = {
        "rec": MedusaForCausalLM.from_base(target, MedusaConfig(num_heads=2, head_type="recurrent")),
        "med": MedusaForCausalLM.from_base(target, MedusaConfig(num_heads=2)),
    }
    names = ["plain", "rec-3", "med-3-lookup", "med-dyn4", "ghost-3"]
    methods = [method_by_name(name, heads=[*heads, "ghost"]) for name in names]
    assert [m.heads for m in methods] == [None, "rec", "med", "med", "ghost"]
    calls: dict[str, list[object]] = {name: [] for name in heads}  # which heads' generate() each call reached
    for name, model in heads.items():
        original = model.generate

        def generate(*args, _name=name, _original=original, **kwargs):
            calls[_name].append(kwargs["tree"])
            return _original(*args, **kwargs)

        model.generate = generate
    result = run_benchmark(target, _tokenizer(), PROMPTS[:2], methods, draft=None, max_new_tokens=10, heads=heads)
    summary = result.summary()
    for name in names[1:4]:
        assert summary[name]["identical_to_plain"] == "2/2", (name, summary[name])
    assert result.skipped["ghost-3"] == "needs the heads named ghost (--medusa ghost=PATH)"
    assert result.settings["arguments"]["rec-3"] == "medusa=True, tree=3 (heads rec)"
    # each method decoded with its own heads: a warm-up and two prompts each
    assert calls["rec"] == [3] * 3
    assert sorted(map(str, calls["med"])) == sorted(["3"] * 3 + [str(DynamicTree(num_nodes=4))] * 3)
    with pytest.raises(ValueError, match="heads named: rec"):
        method_by_name("other-3", heads=["rec"])


@pytest.mark.parametrize("batch_size", [1, 2])
def test_benchmark_runs_methods_and_checks_identity(batch_size: int, tmp_path) -> None:
    target, draft = tiny_target("llama"), tiny_model("llama", seed=0, num_layers=1, sharpen=4.0)
    methods = [METHODS["plain"], METHODS["hf-assistant"], METHODS["specdec"], METHODS["specdec-k4"]]
    result = run_benchmark(
        target, _tokenizer(), PROMPTS, methods, draft=draft, batch_size=batch_size, max_new_tokens=12
    )
    summary = result.summary()
    assert summary["plain"]["speedup_vs_plain"] == pytest.approx(1.0)
    assert summary["specdec"]["identical_to_plain"] == f"{len(PROMPTS)}/{len(PROMPTS)}"
    assert summary["specdec"]["divergences"] == []
    assert 1.0 <= summary["specdec-k4"]["tau"] <= 5.0
    assert len(summary["specdec-k4"]["acceptance_by_position"]) == 4
    if batch_size == 1:
        assert "hf-assistant" in summary
    else:
        assert "batch size 1" in result.skipped["hf-assistant"]
    assert "specdec" in format_table(summary)
    files = write_outputs(result, tmp_path)
    assert json.loads((tmp_path / "results.json").read_text())["summary"]["specdec"]["tokens"] > 0
    assert all(f.exists() and f.stat().st_size > 0 for f in files)
    # The table a page embeds: one row per method that ran, with its arguments, and one "Measured on" line.
    page = (tmp_path / "results.md").read_text().splitlines()
    rows = [line for line in page if line.startswith("| `")]
    assert [row.split(" | ")[0] for row in rows] == ["| `" + name + "`" for name in summary]
    specdec_k4 = next(row for row in rows if row.startswith("| `specdec-k4`"))
    assert "`assistant=draft, num_assistant_tokens=4, num_assistant_tokens_schedule='constant'`" in specdec_k4
    assert f"| {len(PROMPTS)}/{len(PROMPTS)} |" in specdec_k4
    assert page[-1].startswith("Measured on ") and f"batch {batch_size}" in page[-1]


def test_a_compiled_benchmark_runs_every_method_static_and_compiled_and_keeps_identity() -> None:
    """`--compile`: plain decoding and the speculative methods with a static cache and compiled forwards;
    transformers' own assisted generation is skipped with the reason."""
    target, draft = tiny_target("llama"), tiny_model("llama", seed=0, num_layers=1, sharpen=4.0)
    methods = [METHODS["plain"], METHODS["hf-assistant"], METHODS["specdec"]]
    torch._dynamo.reset()
    result = run_benchmark(target, _tokenizer(), PROMPTS[:2], methods, draft=draft, max_new_tokens=8, compile=True)
    summary = result.summary()
    assert result.settings["compiled"] is True and "dynamic cache" in result.skipped["hf-assistant"]
    assert summary["specdec"]["identical_to_plain"] == "2/2"
    assert hasattr(target, "_compiled_call") and hasattr(draft, "_compiled_call")


def test_first_method_must_be_plain() -> None:
    with pytest.raises(ValueError, match="plain"):
        run_benchmark(tiny_target("llama"), _tokenizer(), PROMPTS, [METHODS["specdec"]], draft=None)


@pytest.mark.parametrize("batch_size", [1, 3])
def test_cost_curve_has_every_size_and_leaves_the_cache_as_it_found_it(batch_size: int, monkeypatch) -> None:
    from hf_specdec.generation.kv_cache import CachedSequence

    lengths = []
    forward = CachedSequence.forward

    def counted(self, input_ids, *args, **kwargs):
        lengths.append((input_ids.shape, self.num_slots))
        return forward(self, input_ids, *args, **kwargs)

    monkeypatch.setattr(CachedSequence, "forward", counted)
    curve = verify_cost_curve(
        tiny_model("llama", seed=0), prefix_length=16, sizes=(1, 4), repeats=1, batch_size=batch_size
    )
    assert set(curve) == {1, 4} and all(t > 0 for t in curve.values())
    # the prefix, then each width twice (warm-up and timed), every time after the prefix alone
    assert lengths == [((batch_size, 16), 0), *[((batch_size, n), 16) for n in (1, 1, 4, 4)]]


def test_prompts_from_pypi_wheels_are_interleaved() -> None:
    prompts = load_prompts(["mt-bench", "humaneval", "gsm8k"], 6)
    assert [p.category for p in prompts] == ["mt-bench", "humaneval", "gsm8k"] * 2
    assert all(p.text for p in prompts)
    with pytest.raises(ValueError, match="Unknown prompt categories"):
        load_prompts(["poetry"], 2)


def test_pad_token_is_the_tokenizers() -> None:
    assert _tokenizer().pad_token_id == PAD


def test_medusa_method_runs_beside_the_others() -> None:
    from hf_specdec import MedusaConfig, MedusaForCausalLM

    target = tiny_target("llama")
    medusa = MedusaForCausalLM.from_base(target, MedusaConfig(num_heads=2))
    methods = [METHODS["plain"], METHODS["medusa"], METHODS["specdec"]]
    result = run_benchmark(target, _tokenizer(), PROMPTS[:2], methods, draft=None, max_new_tokens=10, medusa=medusa)
    summary = result.summary()
    assert summary["medusa"]["identical_to_plain"] == "2/2"
    assert "needs a draft" in result.skipped["specdec"]


def test_medusa_tree_methods_by_size_run_and_keep_identity() -> None:
    from hf_specdec import DynamicTree, MedusaConfig, MedusaForCausalLM

    assert method_by_name("medusa-5-lookup").kwargs == {"medusa": True, "tree": 5, "prompt_lookup_num_tokens": 10}
    assert method_by_name("medusa-dyn12").kwargs["tree"] == DynamicTree(num_nodes=12)
    for bad in ("medusa-0", "medusa-x", "medusa-8-lookups", "nonsense"):
        with pytest.raises(ValueError, match="Unknown method"):
            method_by_name(bad)
    target = tiny_target("llama")
    medusa = MedusaForCausalLM.from_base(target, MedusaConfig(num_heads=2, head_type="recurrent"))
    names = ["plain", "medusa-3", "medusa-3-lookup", "medusa-dyn4", "medusa-dyn4-lookup"]
    methods = [method_by_name(name) for name in names]
    result = run_benchmark(target, _tokenizer(), PROMPTS, methods, draft=None, max_new_tokens=10, medusa=medusa)
    summary = result.summary()
    for name in names[1:]:
        assert summary[name]["identical_to_plain"] == f"{len(PROMPTS)}/{len(PROMPTS)}", (name, summary[name])


@pytest.mark.parametrize("batch_size", [1, 2])
def test_prompt_lookup_methods_run_without_a_draft(batch_size: int) -> None:
    """`lookup` needs no draft; `hf-lookup` is transformers' own (batch size 1 only), reached past this library's
    mixin; `specdec-lookup` needs the draft."""
    methods = [METHODS["plain"], METHODS["lookup"], METHODS["hf-lookup"], METHODS["specdec-lookup"]]
    result = run_benchmark(tiny_target("llama"), _tokenizer(), PROMPTS, methods, draft=None, batch_size=batch_size)
    summary = result.summary()
    assert summary["lookup"]["identical_to_plain"] == f"{len(PROMPTS)}/{len(PROMPTS)}"
    assert summary["lookup"]["tau"] >= 1.0
    assert "needs a draft" in result.skipped["specdec-lookup"]
    if batch_size == 1:
        assert summary["hf-lookup"]["identical_to_plain"] == f"{len(PROMPTS)}/{len(PROMPTS)}"
    else:
        assert "batch size 1" in result.skipped["hf-lookup"]


@pytest.mark.parametrize("batch_size", [1, 2])
def test_early_exit_methods_run_beside_transformers_own(batch_size: int) -> None:
    assert method_by_name("early-exit-1-lookup").kwargs == {"assistant_early_exit": 1, "prompt_lookup_num_tokens": 10}
    for bad in ("hf-early-exit-1-lookup", "early-exit-0"):
        with pytest.raises(ValueError, match="Unknown method"):
            method_by_name(bad)
    names = ["plain", "early-exit-1", "early-exit-1-lookup", "hf-early-exit-1"]
    target = tiny_target("llama")
    result = run_benchmark(target, _tokenizer(), PROMPTS, [method_by_name(n) for n in names], batch_size=batch_size)
    summary = result.summary()
    for name in names[1:3]:
        assert summary[name]["identical_to_plain"] == f"{len(PROMPTS)}/{len(PROMPTS)}", (name, summary[name])
    if batch_size == 1:
        assert summary["hf-early-exit-1"]["identical_to_plain"] == f"{len(PROMPTS)}/{len(PROMPTS)}"
    else:
        assert "batch size 1" in result.skipped["hf-early-exit-1"]


def test_draft_tree_methods_by_size_run_and_keep_identity() -> None:
    from hf_specdec import DynamicTree

    assert method_by_name("specdec-tree10-d5-k3").kwargs["tree"] == DynamicTree(num_nodes=10, depth=5, top_k=3)
    assert method_by_name("specdec-tree8").kwargs["tree"] == 8  # as a user writes it: generate(..., tree=8)
    vocab = method_by_name("specdec-tree16-vocab")
    assert vocab.needs_draft_vocab and vocab.kwargs["tree"] == 16
    grafted = method_by_name("specdec-tree8-d4-vocab-lookup")
    assert grafted.needs_draft_vocab and grafted.kwargs["prompt_lookup_num_tokens"] == 10
    assert "prompt_lookup_num_tokens" not in vocab.kwargs
    for bad in ("specdec-tree0", "specdec-tree8-k", "specdec-treex", "specdec-tree8-lookup-vocab"):
        with pytest.raises(ValueError, match="Unknown method"):
            method_by_name(bad)
    target, draft = tiny_target("llama"), tiny_model("llama", seed=0, num_layers=1, sharpen=4.0)
    names = ["plain", "specdec-tree6", "specdec-tree6-d3-k3", "specdec-tree6-lookup"]
    result = run_benchmark(
        target, _tokenizer(), PROMPTS, [method_by_name(n) for n in names], draft=draft, max_new_tokens=10
    )
    summary = result.summary()
    for name in names[1:]:
        assert summary[name]["identical_to_plain"] == f"{len(PROMPTS)}/{len(PROMPTS)}", (name, summary[name])


def test_the_int8_draft_methods_run_and_keep_identity() -> None:
    target, draft = tiny_target("llama"), tiny_model("llama", seed=0, num_layers=1, sharpen=4.0)
    names = ["plain", "specdec-int8", "specdec-int8-lookup"]
    methods = [method_by_name(n) for n in names]
    assert all(m.needs_int8_draft for m in methods[1:])
    result = run_benchmark(target, _tokenizer(), PROMPTS, methods, draft=draft, max_new_tokens=10)
    summary = result.summary()
    for name in names[1:]:
        assert summary[name]["identical_to_plain"] == f"{len(PROMPTS)}/{len(PROMPTS)}", (name, summary[name])
    assert draft.get_output_embeddings().weight.dtype == torch.float32  # the draft itself is untouched


def test_repeats_run_every_method_again_and_time_it_by_its_median_call(monkeypatch) -> None:
    """`repeats=3`: each method runs three times per batch (every method once, then again), and its time is the
    median of the three (a noisy machine's one slow call does not count); outputs are the first call's."""
    from hf_specdec.bench import runner

    calls: list[str] = []
    run = runner._run_method
    warm_up = 2  # one untimed call per method first
    rounds = [1.0, 1.0, 9.0, 9.0, 2.0, 2.0]  # per batch, plain's and specdec's calls: the middle round slow

    def timed(method, models, inputs, kwargs):
        calls.append(method.name)
        sequences, _, stats, peak = run(method, models, inputs, kwargs)
        timed_calls = len(calls) - warm_up
        return sequences, 0.0 if timed_calls <= 0 else rounds[(timed_calls - 1) % 6], stats, peak

    monkeypatch.setattr(runner, "_run_method", timed)
    target, draft = tiny_target("llama"), tiny_model("llama", seed=0, num_layers=1, sharpen=4.0)
    methods = [METHODS["plain"], METHODS["specdec"]]
    result = run_benchmark(target, _tokenizer(), PROMPTS[:2], methods, draft=draft, max_new_tokens=4, repeats=3)
    assert calls[warm_up:] == ["plain", "specdec"] * 3 + ["specdec", "plain"] * 3
    assert [sample.seconds for sample in result.samples] == [2.0, 2.0, 2.0, 2.0]
    assert result.settings["repeats"] == 3 and result.summary()["specdec"]["identical_to_plain"] == "2/2"
    with pytest.raises(ValueError, match="at least 1"):
        run_benchmark(target, _tokenizer(), PROMPTS[:2], methods, draft=draft, repeats=0)
