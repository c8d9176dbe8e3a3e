"""A draft model growing a tree per row (`generate(assistant=draft, tree=DynamicTree(...))`): greedy identity on
every architecture, the draft's cache kept in step with the accepted paths, the target's sampling distribution,
and errors."""

from __future__ import annotations

import copy

import pytest
import torch

import hf_specdec
import hf_specdec.generation.run
from hf_specdec import DynamicTree, SpeculativeCosts
from hf_specdec.drafters.draft_tree import node_log_probs
from hf_specdec.generation.decisions import nodes_worth_verifying
from hf_specdec.trees.dynamic import GrownPool
from tests.goodness_of_fit import sample_copies
from tests.test_sampling_distribution import (
    ALPHA,
    MAX_NEW,
    NUM_SAMPLES,
    PAD,
    POWER_ALPHA,
    PROMPT_A,
    PROMPT_B,
    SAMPLING,
    _models,
    _pvalues,
)
from tests.test_sampling_distribution import _target_joint as sampling_joint
from tests.test_tree_sampling_distribution import BROKEN_RULES
from tests.tiny_models import BUILDERS, ragged_batch, tiny_model, tiny_target

NEW = 30


@pytest.mark.parametrize("arch", sorted(BUILDERS))
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("kind", ["twin", "shallow"])
def test_draft_trees_keep_plain_greedy(arch: str, batch: int, kind: str) -> None:
    target = tiny_target(arch)
    draft = copy.deepcopy(target) if kind == "twin" else tiny_model(arch, seed=0, num_layers=1, sharpen=4.0)
    ids, mask = ragged_batch(batch, seed=batch)
    kwargs = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": NEW, "do_sample": False}
    if kind == "shallow":
        kwargs["repetition_penalty"] = 1.3  # a processor that reads each node's prefix
    plain = target.generate(**kwargs)
    # Free costs: the tree always grows to its depth and every step drafts (the twin costs as much as the target).
    kwargs |= {"speculative_costs": SpeculativeCosts(0.0, 0.0), "return_dict_in_generate": True}
    out = target.generate(**kwargs, assistant=draft, tree=DynamicTree(num_nodes=6, depth=4, top_k=2))
    assert torch.equal(out.sequences, plain)
    if kind == "twin":  # the twin's own best path is always among the nodes, and is accepted
        assert out.speculative.summary()["tau"] > 2.0


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_the_drafts_cache_follows_the_accepted_paths(arch: str) -> None:
    """A twin drafting a width-one tree: every drafted token is accepted at every step, which it would not be if
    the draft's cache lost or repeated a token of the accepted path (fed over several forwards) or of the
    target's own."""
    target = tiny_target(arch)
    ids, mask = ragged_batch(3, seed=4)
    kwargs = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 41, "do_sample": False, "eos_token_id": None}
    out = target.generate(
        **kwargs,
        assistant=copy.deepcopy(target),
        tree=DynamicTree(num_nodes=4, depth=4, top_k=1),
        return_dict_in_generate=True,
        speculative_costs=SpeculativeCosts(0.0, 0.0),  # every step grows the whole depth
    )
    assert torch.equal(out.sequences, target.generate(**kwargs))
    stats = out.speculative
    assert torch.equal(stats.accepted_tokens, stats.drafted_tokens)  # nothing rejected
    assert stats.target_forwards.tolist() == [8, 8, 8]  # 1 + 8 x (4 + 1) = 41 tokens


@pytest.mark.parametrize("arch", ["llama", "gpt2", "mistral"])
@pytest.mark.parametrize("batch", [1, 3])
def test_lookup_grafted_onto_draft_trees_keeps_plain_greedy(arch: str, batch: int) -> None:
    """Each row's looked-up continuation grafted onto its draft tree (sharing the draft's nodes where they agree)."""
    target = tiny_target(arch)
    draft = tiny_model(arch, seed=0, num_layers=1, sharpen=4.0)
    ids, mask = ragged_batch(batch, seed=batch + 4)
    kwargs = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 40, "do_sample": False}
    kwargs["repetition_penalty"] = 1.05  # a processor that reads each node's prefix (mild: repeats still occur)
    plain = target.generate(**kwargs)
    out = target.generate(
        **kwargs,
        assistant=draft,
        tree=DynamicTree(num_nodes=4, depth=2, top_k=2),
        prompt_lookup_num_tokens=6,
        speculative_costs=SpeculativeCosts(0.0, 0.0),  # every step drafts, and every match is grafted
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, plain)
    assert out.speculative.lookup_steps > 0


def test_the_drafts_cache_follows_paths_through_grafted_nodes() -> None:
    """A twin drafting a width-one tree of depth 2, with lookup's continuations grafted on: the accepted paths run
    past the draft's own nodes into grafted ones the draft was never fed, which it must be fed at the next step
    (all of them, in order), or its next tree would go wrong. With its cache right, every step but the last
    accepts at least the draft's two nodes."""
    target = tiny_target("llama")
    ids, mask = ragged_batch(3, seed=4)
    kwargs = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 40, "do_sample": False, "eos_token_id": None}
    out = target.generate(
        **kwargs,
        assistant=copy.deepcopy(target),
        tree=DynamicTree(num_nodes=2, depth=2, top_k=1),
        prompt_lookup_num_tokens=6,
        speculative_costs=SpeculativeCosts(0.0, 0.0),
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, target.generate(**kwargs))
    stats = out.speculative
    assert bool((stats.accepted_tokens >= 2 * (stats.target_forwards - 1)).all())
    assert bool((stats.accepted_tokens > 2 * stats.target_forwards).any())  # some paths ran through grafted nodes


def test_lookup_drafts_alone_once_the_draft_runs_out_of_positions() -> None:
    """GPT-2's draft has no position left to draft at near the end of its table: the tree's root carries the
    lookup's chain alone (or nothing), and outputs stay plain greedy's."""
    target, draft = tiny_target("gpt2"), tiny_model("gpt2", seed=0, num_layers=1, sharpen=4.0)
    limit = target.config.n_positions
    pattern = torch.tensor([5, 6, 7, 8, 9])
    ids = pattern.repeat(2, (limit - 6) // 5 + 1)[:, : limit - 6]
    kwargs = {"input_ids": ids, "max_length": limit, "do_sample": False, "eos_token_id": None, "pad_token_id": 0}
    out = target.generate(**kwargs, assistant=draft, tree=4, prompt_lookup_num_tokens=4, return_dict_in_generate=True)
    assert torch.equal(out.sequences, target.generate(**kwargs))


@pytest.mark.parametrize("drafter", ["draft model", "recurrent heads"])
def test_the_constant_schedule_verifies_the_whole_tree_at_every_step(drafter: str) -> None:
    """With costs that make every node and depth a loss, the adaptive schedule verifies fewer nodes than the tree
    holds; `num_assistant_tokens_schedule="constant"` grows and verifies the whole tree at every step. Both keep
    plain greedy's tokens."""
    from hf_specdec import MedusaConfig, MedusaForCausalLM

    target = tiny_target("llama")
    ids, mask = ragged_batch(2, seed=3)
    kwargs = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 24, "do_sample": False}
    plain = target.generate(**kwargs)
    tree = DynamicTree(num_nodes=6, depth=3, top_k=2)
    if drafter == "draft model":
        model, extra = target, {"assistant": tiny_model("llama", seed=0, num_layers=1, sharpen=4.0)}
    else:
        torch.manual_seed(0)
        model = MedusaForCausalLM.from_base(target, MedusaConfig(num_heads=3, head_type="recurrent"))
        extra = {"medusa": True}
    widths = {}
    for schedule in ("adaptive", "constant"):
        out = model.generate(
            **kwargs,
            **extra,
            tree=tree,
            num_assistant_tokens_schedule=schedule,
            speculative_costs=SpeculativeCosts(1.0, 1.0),  # every node, every depth is a loss
            return_dict_in_generate=True,
        )
        assert torch.equal(out.sequences, plain)
        widths[schedule] = out.speculative.verify_widths
    whole, steps = widths["constant"].get(tree.num_nodes + 1, 0), sum(widths["constant"].values())
    assert whole >= steps - 2  # the whole tree, but where the length limit leaves less room (the last steps)
    assert max(widths["adaptive"]) < tree.num_nodes + 1


def _tree_samples(mode: str, seed: int, **lookup: int) -> tuple[list[torch.Tensor], hf_specdec.SpeculativeStats]:
    target, draft = _models()
    sampling = {k: v for k, v in SAMPLING[mode].items() if v is not None} | lookup
    tree = DynamicTree(num_nodes=6, depth=3, top_k=2)
    return sample_copies(
        target, (PROMPT_A, PROMPT_B), NUM_SAMPLES, PAD, MAX_NEW, seed, assistant=draft, tree=tree,
        speculative_costs=SpeculativeCosts(0.0, 0.0), **sampling,
    )  # fmt: skip


@pytest.mark.parametrize("mode", ["plain", "warped"])
def test_draft_tree_sampling_follows_the_target_distribution(mode: str) -> None:
    (samples_a, samples_b), stats = _tree_samples(mode, seed=77)
    rate = stats.summary()["acceptance_rate"]
    assert 0.05 < rate < 0.95, rate  # drafts are accepted and rejected
    for samples, prompt in ((samples_a, PROMPT_A), (samples_b, PROMPT_B)):
        pvalues = _pvalues(samples, sampling_joint(prompt, mode))
        assert min(pvalues.values()) >= ALPHA, (prompt, pvalues)


def test_draft_tree_with_lookup_sampling_follows_the_target_distribution() -> None:
    """Grafted nodes are certain drafts beside the draft's own: sampling stays the target's."""
    (samples_a, samples_b), stats = _tree_samples("plain", seed=79, prompt_lookup_num_tokens=2)
    assert stats.lookup_steps > 0
    for samples, prompt in ((samples_a, PROMPT_A), (samples_b, PROMPT_B)):
        pvalues = _pvalues(samples, sampling_joint(prompt, "plain"))
        assert min(pvalues.values()) >= ALPHA, (prompt, pvalues)


def test_a_broken_rule_on_draft_trees_is_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hf_specdec.generation.run, "sample_accept_tree", BROKEN_RULES["keep_rejected_mass"])
    (samples_a, _), _ = _tree_samples("plain", seed=78)
    assert min(_pvalues(samples_a, sampling_joint(PROMPT_A, "plain")).values()) < POWER_ALPHA


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tree": 6}, "pass `assistant=` too"),
        ({"tree": 6, "assistant": "draft", "num_assistant_tokens": 3}, "`num_assistant_tokens` sets a draft chain"),
        ({"tree": "wide", "assistant": "draft"}, "DynamicTree or a number of nodes"),
    ],
)
def test_errors(kwargs: dict, message: str) -> None:
    target = tiny_target("llama")
    if kwargs.get("assistant") == "draft":
        kwargs["assistant"] = tiny_model("llama", seed=1, num_layers=1)
    ids, _ = ragged_batch(1)
    with pytest.raises((ValueError, TypeError), match=message):
        target.generate(input_ids=ids, max_new_tokens=4, **kwargs)


def test_the_tree_stops_growing_where_a_depth_does_not_pay() -> None:
    """With free draft forwards the tree grows its whole depth at every step; when a draft forward costs most of
    a target forward, growing stops at the depths the draft is not sure enough of (plain greedy either way)."""
    target = tiny_target("llama")
    draft = tiny_model("llama", seed=0, num_layers=1, sharpen=4.0)
    ids, mask = ragged_batch(2, seed=5)
    kwargs = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 30, "do_sample": False, "eos_token_id": None}
    plain = target.generate(**kwargs)
    tree = DynamicTree(num_nodes=14, depth=4, top_k=2)  # every node grown is verified: the depth is what grew
    kwargs |= {"assistant": draft, "tree": tree, "return_dict_in_generate": True}
    depths = []
    for costs in (SpeculativeCosts(0.0, 0.0), SpeculativeCosts(0.6, 0.0)):
        out = target.generate(**kwargs, speculative_costs=costs)
        assert torch.equal(out.sequences, plain)
        stats = out.speculative
        drafting_steps = int(stats.target_forwards[0]) - stats.plain_steps
        depths.append(int(stats.drafted_tokens[0]) / max(drafting_steps, 1))
    assert depths[0] > 3.5, depths  # the whole depth, but near the length limit
    assert depths[1] < depths[0] - 1.0, depths


def test_nodes_worth_verifying_pay_for_their_verification() -> None:
    """Path probabilities, best first: row 0 0.9, 0.5, 0.2, 0.05; row 1 0.8, 0.1, 0.1 and a node ruled out. Both
    rows verify one width, which grows while the next node brings the least advanced rows at least the cost."""
    probs = torch.tensor([[1.0, 0.2, 0.9, 0.05, 0.5], [1.0, 0.1, 0.0, 0.8, 0.1]])  # the root first, pool order
    scores = probs.log()
    both, second = [True, True], [False, True]
    assert nodes_worth_verifying(scores, 4, both, 0.1) == 3  # mean gains 0.85, 0.3, 0.15, 0.025
    assert nodes_worth_verifying(scores, 4, both, 0.5) == 1
    assert nodes_worth_verifying(scores, 4, both, 0.01) == 4
    assert nodes_worth_verifying(scores, 2, both, 0.01) == 2  # never more than asked for
    assert nodes_worth_verifying(scores, 4, both, 0.0) == 4  # free verification: every node
    assert nodes_worth_verifying(scores, 4, both, 2.0) == 1  # at least one
    assert nodes_worth_verifying(scores, 4, second, 0.09) == 3  # only row 1's gains count


def test_a_tree_verifies_fewer_nodes_where_verification_costs(monkeypatch: pytest.MonkeyPatch) -> None:
    """With free verification the tree verifies all its nodes; when each verified token costs a tenth of a target
    forward, only the nodes likely enough to pay for it (plain greedy's tokens either way)."""
    widths: list[int] = []
    select = GrownPool.select

    def recording(self: GrownPool, num_nodes: int) -> tuple:
        widths.append(num_nodes)
        return select(self, num_nodes)

    monkeypatch.setattr(GrownPool, "select", recording)
    target = tiny_target("llama")
    draft = tiny_model("llama", seed=0, num_layers=1, sharpen=4.0)
    ids, mask = ragged_batch(2, seed=6)
    kwargs = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 24, "do_sample": False}
    plain = target.generate(**kwargs)
    tree = DynamicTree(num_nodes=10, depth=4, top_k=3)
    runs = []
    for costs in (SpeculativeCosts(0.0, 0.0), SpeculativeCosts(0.0, 0.1)):
        widths.clear()
        out = target.generate(**kwargs, assistant=draft, tree=tree, speculative_costs=costs)
        assert torch.equal(out, plain)
        runs.append(list(widths))
    free, costly = (sum(run) / len(run) for run in runs)
    assert free > 9.0, runs  # the whole tree, but where the length limit leaves less room
    assert max(runs[1]) < 10 and costly < free - 2.0, runs


def test_node_log_probs_of_every_kind_of_node() -> None:
    """A usual node keeps its log-softmax; a nan score is never proposed; a node whose scores leave nothing, and a
    node ruled out, get -inf everywhere; +inf scores come out nan (never the best)."""
    inf = float("inf")
    scores = torch.tensor(
        [[[1.0, 2.0, -inf, 0.5], [1.0, float("nan"), 3.0, 0.0], [0.0, inf, 1.0, 2.0]],
         [[-inf, -inf, -inf, -inf], [2.0, 1.0, 0.0, -1.0], [0.3, 0.2, 0.1, 0.0]]]
    )  # fmt: skip
    alive = torch.tensor([[True, True, True], [True, False, True]])
    careful = scores.masked_fill(~alive[..., None] | torch.isnan(scores), -inf)
    none_left = ~(careful > -inf).any(dim=-1, keepdim=True)
    expected = torch.log_softmax(careful.masked_fill(none_left, 0.0), dim=-1).masked_fill(none_left, -inf)
    got = node_log_probs(scores, alive)
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(got[1, 2], torch.log_softmax(scores[1, 2], dim=-1))  # a usual node
    assert torch.isneginf(got[1, 0]).all() and torch.isneginf(got[1, 1]).all()
    assert torch.isneginf(got[0, 1, 1]) and torch.isfinite(got[0, 1, [0, 2, 3]]).all()
