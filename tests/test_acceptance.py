"""Hand-computed cases for the acceptance rules and the residual distribution."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_specdec import greedy_accept, point_draft_sampling, residual_distribution, speculative_sampling
from hf_specdec.generation.acceptance import greedy_accept_chain, greedy_accept_tree, sample_accept_tree
from hf_specdec.generation.drafter import chain_proposal
from hf_specdec.trees.row_trees import RowTrees


def _one_hot_logits(tokens: list[list[int]], vocab: int = 10) -> torch.Tensor:
    """Logits whose argmax is `tokens[b][j]` at row b, position j."""
    t = torch.tensor(tokens)
    return torch.nn.functional.one_hot(t, vocab).float() * 5.0  # (B, n, V)


def test_greedy_accepts_the_agreeing_prefix() -> None:
    drafts = torch.tensor([[5, 7, 9], [5, 7, 9], [1, 2, 3]])
    logits = _one_hot_logits([[5, 7, 2, 4], [5, 7, 9, 4], [8, 2, 3, 0]])
    num_accepted, next_token = greedy_accept(drafts, logits)
    assert num_accepted.tolist() == [2, 3, 0]
    assert next_token.tolist() == [2, 4, 8]  # a correction, the bonus token, a correction at the first position


def test_greedy_does_not_accept_after_a_mismatch() -> None:
    # Position 1 matches again after position 0 failed: still nothing is accepted.
    num_accepted, next_token = greedy_accept(torch.tensor([[1, 2]]), _one_hot_logits([[0, 2, 5]]))
    assert num_accepted.tolist() == [0]
    assert next_token.tolist() == [0]


def test_residual_by_hand() -> None:
    p = torch.tensor([0.6, 0.3, 0.1])
    q = torch.tensor([0.2, 0.2, 0.6])
    # max(0, p - q) = [0.4, 0.1, 0.0], normalised: [0.8, 0.2, 0.0]
    torch.testing.assert_close(residual_distribution(p, q), torch.tensor([0.8, 0.2, 0.0]))


def test_residual_of_identical_distributions_is_p() -> None:
    p = torch.tensor([[0.5, 0.5, 0.0]])
    torch.testing.assert_close(residual_distribution(p, p.clone()), p)


def test_identical_distributions_accept_everything() -> None:
    generator = torch.Generator().manual_seed(0)
    q = torch.softmax(torch.randn(4, 3, 6, generator=generator), dim=-1)  # (B, k, V)
    bonus = torch.nn.functional.one_hot(torch.tensor([1, 2, 3, 4]), 6).float()[:, None]  # (B, 1, V)
    p = torch.cat([q, bonus], dim=1)
    drafts = torch.multinomial(q.reshape(-1, 6), 1, generator=generator).reshape(4, 3)
    num_accepted, next_token = speculative_sampling(drafts, q, p, generator)
    assert num_accepted.tolist() == [3, 3, 3, 3]
    assert next_token.tolist() == [1, 2, 3, 4]  # the bonus token comes from p after the last draft


def test_a_token_the_target_never_emits_is_rejected_and_resampled_from_the_residual() -> None:
    q = torch.tensor([[[1.0, 0.0, 0.0, 0.0]]])  # the draft is sure of token 0
    p = torch.tensor([[[0.0, 0.0, 0.0, 1.0], [0.25, 0.25, 0.25, 0.25]]])  # the target never emits 0 here
    num_accepted, next_token = speculative_sampling(torch.tensor([[0]]), q, p, torch.Generator().manual_seed(0))
    assert num_accepted.tolist() == [0]
    assert next_token.tolist() == [3]  # residual max(0, p - q) = p: all mass on 3


def test_acceptance_probability_is_p_over_q() -> None:
    """p(x) = 0.3, q(x) = 0.6: x is accepted with probability min(1, 0.3 / 0.6) = 0.5."""
    n = 20_000
    q = torch.tensor([0.6, 0.4]).expand(n, 1, 2)
    p = torch.tensor([[0.3, 0.7], [0.5, 0.5]]).expand(n, 2, 2)
    drafts = torch.zeros(n, 1, dtype=torch.long)
    num_accepted, next_token = speculative_sampling(drafts, q, p, torch.Generator().manual_seed(1))
    rate = num_accepted.float().mean().item()
    assert abs(rate - 0.5) < 0.02  # 4.5 standard deviations of a binomial(20000, 0.5) mean
    # After a rejection the residual is normalise(max(0, [0.3, 0.7] - [0.6, 0.4])) = [0, 1].
    assert (next_token[num_accepted == 0] == 1).all()


def test_rows_are_independent() -> None:
    q = torch.tensor([[[1.0, 0.0]], [[1.0, 0.0]]])
    p = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]]])
    num_accepted, next_token = speculative_sampling(torch.tensor([[0], [0]]), q, p)
    assert num_accepted.tolist() == [1, 0]
    assert next_token.tolist() == [1, 1]


# ---------------------------------------------------------------------------------------------------------
# Trees: several children per node, drawn from q (the rule's arithmetic by hand)
# ---------------------------------------------------------------------------------------------------------

TWO_CHILDREN = RowTrees.from_parents(torch.tensor([[-1, 0, 0]]))


def test_siblings_drawn_from_q_by_hand() -> None:
    """Root p = [.1, .5, .4, 0], q = [.6, .3, .1, 0]; children tokens 0 then 1.

    Child 0: accepted with min(1, .1/.6) = 1/6. Rejected: p <- normalise(max(0, p - q)) = [0, .4, .6, 0] and
    q <- q without token 0 = [0, .75, .25, 0]. Child 1: accepted with min(1, .4/.75) = 8/15, so in 5/6 * 8/15
    = 4/9 of rows. Rejected: p <- normalise(max(0, [0, .4, .6, 0] - [0, .75, .25, 0])) = token 2 for sure."""
    n = 60_000
    p = torch.zeros(n, 3, 4)
    p[:, 0] = torch.tensor([0.1, 0.5, 0.4, 0.0])
    p[:, 1:, 3] = 1.0  # after either child the target says 3
    q = torch.zeros(n, 3, 4)
    q[:, 0] = torch.tensor([0.6, 0.3, 0.1, 0.0])
    nodes = torch.tensor([[0, 0, 1]]).expand(n, -1)
    node, num_accepted, next_token = sample_accept_tree(
        nodes, p, TWO_CHILDREN.expand(n), torch.Generator().manual_seed(0), q=q
    )
    assert abs((node == 1).float().mean().item() - 1 / 6) < 0.01
    assert abs((node == 2).float().mean().item() - 4 / 9) < 0.01
    assert torch.equal(num_accepted, (node > 0).long())
    assert bool((next_token[node > 0] == 3).all())
    assert bool((next_token[node == 0] == 2).all())


def test_a_child_q_gives_no_mass_is_a_certain_proposal() -> None:
    """q cannot have drawn token 1 (q(1) = 0): it is verified as proposed with certainty, accepted with
    p(1) = 0.5 (not always, as u * q(1) < p(1) would), and a rejection leaves p without it: token 0."""
    n = 20_000
    q = torch.tensor([1.0, 0.0, 0.0]).expand(n, 1, 3)
    p = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]]).expand(n, 2, 3)
    num_accepted, next_token = speculative_sampling(
        torch.ones(n, 1, dtype=torch.long), q, p, torch.Generator().manual_seed(2)
    )
    assert abs(num_accepted.float().mean().item() - 0.5) < 0.02
    assert bool((next_token[num_accepted == 0] == 0).all())
    assert bool((next_token[num_accepted == 1] == 2).all())


def test_padding_nodes_are_never_accepted() -> None:
    """Node 3 is padding (hangs from the root, `real` False): never accepted though the target is sure of its
    token; the real children are impossible, so the step's token is the target's own 3."""
    trees = RowTrees.from_parents(torch.tensor([[-1, 0, 0, 0]]), real=torch.tensor([[True, True, True, False]]))
    p = torch.nn.functional.one_hot(torch.tensor([[3, 0, 0, 0]]), 4).float()
    q = torch.tensor([0.5, 0.25, 0.25, 0.0]).expand(1, 4, 4)
    for rule_q in (q, None):
        node, num_accepted, next_token = sample_accept_tree(torch.tensor([[0, 1, 2, 3]]), p, trees, q=rule_q)
        assert (node.item(), num_accepted.item(), next_token.item()) == (0, 0, 3)
    node, num_accepted, next_token = greedy_accept_tree(torch.tensor([[0, 1, 2, 3]]), p, trees)
    assert (node.item(), num_accepted.item(), next_token.item()) == (0, 0, 3)


def test_chain_filler_after_a_rows_drafts_is_never_accepted() -> None:
    drafts = torch.tensor([[3, 3], [3, 3], [3, 3]])
    p = torch.nn.functional.one_hot(torch.full((3, 3), 3), 4).float()  # the target is sure of 3 everywhere
    num_drafted = torch.tensor([0, 1, 2])
    num_accepted, next_token = point_draft_sampling(drafts, p, num_drafted, torch.Generator().manual_seed(0))
    assert num_accepted.tolist() == [0, 1, 2]
    assert next_token.tolist() == [3, 3, 3]  # drawn from p itself after the last real draft
    num_accepted, next_token = greedy_accept(drafts, p, num_drafted)
    assert num_accepted.tolist() == [0, 1, 2]
    assert next_token.tolist() == [3, 3, 3]


def test_chain_rules_are_the_tree_rules_on_a_chain() -> None:
    generator = torch.Generator().manual_seed(5)
    q = torch.softmax(torch.randn(64, 3, 7, generator=generator), dim=-1)
    p = torch.softmax(torch.randn(64, 4, 7, generator=generator), dim=-1)
    drafts = torch.multinomial(q.reshape(-1, 7), 1, generator=generator).reshape(64, 3)
    nodes = torch.cat([torch.zeros(64, 1, dtype=torch.long), drafts], dim=1)
    chain = RowTrees.chain(4).expand(64)
    padded_q = torch.cat([q, torch.zeros(64, 1, 7)], dim=1)  # the leaf's q, never read
    _, tree_accepted, tree_token = sample_accept_tree(nodes, p, chain, torch.Generator().manual_seed(1), q=padded_q)
    num_accepted, next_token = speculative_sampling(drafts, q, p, torch.Generator().manual_seed(1))
    assert torch.equal(num_accepted, tree_accepted) and torch.equal(next_token, tree_token)
    assert 0 < num_accepted.float().mean().item() < 3


def test_no_drafts() -> None:
    p = torch.tensor([[[0.0, 1.0]]])
    assert speculative_sampling(torch.zeros(1, 0, dtype=torch.long), torch.zeros(1, 0, 2), p)[1].tolist() == [1]
    assert point_draft_sampling(torch.zeros(1, 0, dtype=torch.long), p)[1].tolist() == [1]


def test_half_precision_probabilities_are_handled_in_float32() -> None:
    generator = torch.Generator().manual_seed(3)
    q = torch.softmax(torch.randn(32, 2, 5, generator=generator), dim=-1).half()
    p = torch.softmax(torch.randn(32, 3, 5, generator=generator), dim=-1).half()
    drafts = torch.multinomial(q.float().reshape(-1, 5), 1, generator=generator).reshape(32, 2)
    half = speculative_sampling(drafts, q, p, torch.Generator().manual_seed(4))
    single = speculative_sampling(drafts, q.float(), p.float(), torch.Generator().manual_seed(4))
    assert torch.equal(half[0], single[0]) and torch.equal(half[1], single[1])


@settings(max_examples=200, deadline=None)
@given(
    batch=st.integers(1, 4),
    k=st.integers(0, 6),
    vocab=st.integers(2, 5),
    seed=st.integers(0, 10**6),
    ragged=st.booleans(),
)
def test_the_chain_rule_agrees_with_the_tree_rule_on_chains(
    batch: int, k: int, vocab: int, seed: int, ragged: bool
) -> None:
    """Greedy acceptance of chains (their own, shorter rule) is the tree rule's on every chain, filler included."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch, k), generator=generator)
    lengths = torch.randint(0, k + 1, (batch,), generator=generator) if ragged else None
    proposal = chain_proposal(torch.randint(0, vocab, (batch,), generator=generator), tokens, lengths=lengths)
    scores = torch.randn(batch, k + 1, vocab, generator=generator)
    chain = greedy_accept_chain(proposal.nodes, scores, proposal.trees)
    tree = greedy_accept_tree(proposal.nodes, scores, proposal.trees)
    assert all(torch.equal(a, b) for a, b in zip(chain, tree, strict=True))
