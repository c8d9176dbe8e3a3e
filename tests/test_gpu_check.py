"""`hf-specdec gpu`: the acceptance record's arithmetic, and the whole command end to end on this CPU (tiny
models), in the table format a GPU run fills in."""

from __future__ import annotations

import json

import pytest

from hf_specdec.bench.acceptance_record import StepRecord, load_record
from hf_specdec.bench.gpu import EAGER_WIDTHS, PairCosts, _curve, predict
from hf_specdec.bench.overhead import Overhead
from hf_specdec.cli import main

CHAIN = StepRecord("draft-chain-4", "", 10, 31, 40, {5: 10}, [10, 10, 10, 10], [8, 6, 4, 2])


def test_a_records_tau_and_its_predicted_speedup_on_free_forwards_are_its_tokens_per_step() -> None:
    flat = lambda n: 1.0  # noqa: E731 - verifying any width costs one forward, the draft nothing
    assert CHAIN.tau == 3.1
    assert CHAIN.predicted_speedup(flat, 0.0, 0.0, 0.0) == pytest.approx(3.1)
    # A draft forward costing a tenth of the target's: 4 of them per step.
    assert CHAIN.predicted_speedup(flat, 0.1, 0.0, 0.0) == pytest.approx(3.1 / 1.4)
    # The host's time per step counts on both sides.
    assert CHAIN.predicted_speedup(flat, 0.0, 1.0, 0.5) == pytest.approx(3.1 * 1.5 / 2.0)


def test_a_chain_truncated_to_fewer_drafts_commits_and_costs_what_those_would() -> None:
    two = CHAIN.truncated(2)
    assert two.tokens == 10 + 8 + 6 and two.draft_forwards == 20 and two.verify_widths == {3: 10}
    ragged = StepRecord("c", "", 10, 20, 15, {1: 2, 2: 3, 3: 5}, [8, 5], [6, 2])
    one = ragged.truncated(1)
    assert one.verify_widths == {1: 2, 2: 8} and one.tokens == 16 and one.draft_forwards == 8


def test_heads_are_priced_at_their_own_forward_and_only_eager() -> None:
    costs = PairCosts("t", "d", eager={1: 1.0, 3: 1.0}, compiled={1: 1.0, 3: 1.0}, draft_eager=0.5)
    costs.draft_compiled, costs.heads_eager = 0.5, 0.1
    heads = StepRecord("heads-tree-8", "", 10, 25, 30, {3: 10}, [10, 10], [9, 6])
    host = {"plain": Overhead("plain", 0.0, 1.0, 1.0, 1.0), "eagle": Overhead("eagle", 0.0, 1.0, 1.0, 2.5)}
    (prediction,) = predict(costs, [heads], host)
    assert prediction.eager == pytest.approx(2.5 / (1.0 + 3 * 0.1))  # 3 heads forwards per step at 0.1 each
    assert prediction.compiled is None  # the heads were timed eager only


def test_verification_costs_between_measured_widths() -> None:
    eager = _curve({1: 1.0, 4: 4.0, 8: 6.0}, compiled=False)
    assert eager is not None and eager(2) == 2.0 and eager(6) == 5.0 and eager(16) == 10.0
    compiled = _curve({1: 1.0, 8: 2.0, 24: 3.0}, compiled=True)
    assert compiled is not None and compiled(1) == 1.0 and compiled(5) == 2.0 and compiled(17) == 3.0
    with pytest.raises(KeyError):
        compiled(25)  # bucket 32: wider than anything measured
    assert _curve({2: 1.0}, compiled=False) is None  # no one-token forward: plain decoding is not priced


def test_the_kept_record_holds_every_method_with_consistent_counts() -> None:
    setting, records = load_record()
    assert {"target", "draft", "prompts", "dtype", "recorded", "command"} <= set(setting)
    names = {r.method for r in records}
    assert {"draft-chain-8", "draft-tree-16", "lookup-10"} <= names
    for record in records:
        assert sum(record.verify_widths.values()) == record.steps and 1.0 <= record.tau <= 1 + max(record.verify_widths)
        drafts = record.method.startswith(("draft", "heads"))
        assert record.draft_forwards > 0 if drafts else record.draft_forwards == 0


def test_the_command_runs_end_to_end_on_a_cpu(tmp_path, capsys) -> None:
    out = tmp_path / "gpu.json"
    argv = ["gpu", "--device", "cpu", "--tiny", "--dtype", "float32", "--pairs", "qwen2.5-1.5b:qwen2.5-0.5b"]
    assert main([*argv, "--compiled-widths", "1,4", "--budget-seconds", "600", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Verification cost V(n)" in printed and "Predicted speedup" in printed and "| lookup |" in printed
    result = json.loads(out.read_text())
    (pair,) = result["pairs"]
    assert sorted(int(n) for n in pair["eager"]) == sorted(EAGER_WIDTHS)
    assert sorted(int(n) for n in pair["compiled"]) == [1, 4]
    assert pair["draft_eager"] > 0 and pair["draft_compiled"] > 0 and pair["heads_eager"] > 0 and not pair["notes"]
    assert "| EAGLE-3 heads on qwen2.5-1.5b, 4 tokens |" in printed
    _, records = load_record()
    assert len(result["predictions"]) == len(records)
    assert all(p["eager"] > 0 for p in result["predictions"])
    chain = next(p for p in result["predictions"] if p["method"].startswith("draft-chain"))
    assert chain["compiled"] is not None  # a chain of at most 3 drafts fits the compiled widths measured
    # The host's reads per step on every path, from the counter the tests bound: what the first GPU run will see.
    reads = {row["path"]: row["reads_per_step"] for row in result["overhead"]}
    assert set(reads) == {"plain", "assistant-constant", "assistant", "lookup", "tree-8", "eagle"}
    assert reads["assistant-constant"] <= 2.2 and reads["lookup"] <= 2.2, reads
    assert max(reads["assistant"], reads["tree-8"], reads["eagle"]) <= 6.0, reads
