"""Hand-computed cases for the acceptance rules and the residual distribution."""

from __future__ import annotations

import torch

from hf_specdec import greedy_accept, residual_distribution, speculative_sampling


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
