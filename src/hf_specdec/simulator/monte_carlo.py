"""Monte-Carlo of speculative decoding on synthetic target/draft distributions, through the library's own
acceptance rules ([`~hf_specdec.speculative_sampling`], [`~hf_specdec.greedy_accept`]).

Nothing here flips a coin with a fixed acceptance rate: each step draws target distributions p and draft
distributions q over a small vocabulary, samples the drafts from q, and lets the library's rule decide.
The divergence between p and q sets the acceptance rate, which for speculative sampling is, per position,

    alpha = sum_x min(p(x), q(x))                    (Leviathan et al., section 3.1)

and for greedy decoding the probability that argmax q == argmax p. The closed forms of
[`~hf_specdec.simulator.closed_form`] at that alpha must then match the simulated tau within its confidence
interval, which `tests/test_simulator_monte_carlo.py` checks.

Two kinds of distributions:

- `synthetic_pairs`: fresh random logits z at every position of every step, p = softmax(s * z) and
  q = softmax(s * z + divergence * noise), a spread of easy and hard positions as in real text;
- `pair_with_acceptance`: one fixed pair (p, q) with a chosen alpha, used at every position. Then every
  emitted token must follow p exactly, which makes a goodness-of-fit test of the emitted tokens valid.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hf_specdec.generation.acceptance import greedy_accept, speculative_sampling
from hf_specdec.simulator.closed_form import expected_tokens, step_cost
from hf_specdec.simulator.cost_curve import CostCurve
from hf_specdec.simulator.estimates import ChiSquare, Estimate, chi_square_test, mean_estimate, proportion_estimate
from hf_specdec.simulator.validation import check_draft_length, check_nonnegative, check_probability

_MAX_ELEMENTS_PER_CHUNK = 1 << 22  # bounds memory: steps per chunk * (gamma + 1) * vocab


def synthetic_pairs(
    shape: tuple[int, ...],
    vocab_size: int,
    divergence: float,
    generator: torch.Generator,
    logit_scale: float = 2.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random target and draft distributions: p = softmax(s * z), q = softmax(s * z + divergence * noise).

    Args:
        shape (`tuple[int, ...]`): leading dimensions, e.g. `(steps, gamma + 1)`.
        vocab_size (`int`): V, at least 2.
        divergence (`float`): standard deviation of the draft's logit noise; 0 makes q == p (alpha = 1).
        generator (`torch.Generator`): source of randomness.
        logit_scale (`float`): s, the spread of the target's logits; larger means more peaked targets.

    Returns:
        `(p, q)`, each `torch.Tensor` of shape `(*shape, V)` (float32).
    """
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be at least 2, got {vocab_size!r}.")
    divergence = check_nonnegative("divergence", divergence, "the draft's logit noise, 0 for an exact draft")
    logits = logit_scale * torch.randn((*shape, vocab_size), generator=generator)  # (*shape, V)
    noise = torch.randn((*shape, vocab_size), generator=generator)  # (*shape, V)
    return logits.softmax(dim=-1), (logits + divergence * noise).softmax(dim=-1)


def overlap(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """sum_x min(p(x), q(x)) over the last dimension: the acceptance rate of speculative sampling."""
    return torch.minimum(p.double(), q.double()).sum(dim=-1).clamp_max(1.0)  # float32 sums can pass 1


def pair_with_acceptance(
    alpha: float, vocab_size: int = 32, seed: int = 0, logit_scale: float = 2.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """One target/draft pair `(p, q)`, each `(V,)`, whose overlap sum(min(p, q)) is `alpha` (to 1e-6).

    The pair is [`synthetic_pairs`]'s with the divergence found by bisection. The overlap is continuous in
    the divergence, 1 at 0 and tending to p(argmax noise) as it grows, so every alpha above that limit is
    reached; a lower alpha raises `ValueError`.
    """
    alpha = check_probability("alpha", alpha)
    generator = torch.Generator().manual_seed(seed)
    logits = logit_scale * torch.randn(vocab_size, generator=generator, dtype=torch.float64)  # (V,)
    noise = torch.randn(vocab_size, generator=generator, dtype=torch.float64)  # (V,)
    p = logits.softmax(dim=-1)

    def pair_at(divergence: float) -> tuple[torch.Tensor, torch.Tensor]:
        return p.float(), (logits + divergence * noise).softmax(dim=-1).float()

    low, high = 0.0, 1.0
    while float(overlap(*pair_at(high))) > alpha:
        high *= 2
        if high > 1e4:
            raise ValueError(
                f"No draft of this family reaches alpha={alpha} for vocab_size={vocab_size} (seed {seed}); "
                "ask for a higher alpha, a larger vocab_size or another seed."
            )
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if float(overlap(*pair_at(mid))) > alpha else (low, mid)
    return pair_at((low + high) / 2)


def draft_and_verify(
    p: torch.Tensor, q: torch.Tensor, generator: torch.Generator, greedy: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One speculative step per row: draft from q, then accept with the library's rule.

    Args:
        p (`torch.Tensor` of shape `(steps, k + 1, V)`): target distributions at the k drafted positions and
            the one after them.
        q (`torch.Tensor` of shape `(steps, k, V)`): draft distributions at the drafted positions.
        generator (`torch.Generator`): source of randomness for drafting and acceptance.
        greedy (`bool`): draft argmax q and verify with [`greedy_accept`] instead of sampling.

    Returns:
        `(draft_tokens, num_accepted, next_token)`: `(steps, k)`, `(steps,)`, `(steps,)`.
    """
    steps, k, vocab = q.shape
    if greedy:
        draft_tokens = q.argmax(dim=-1)  # (S, k)
        num_accepted, next_token = greedy_accept(draft_tokens, p.log())
    else:
        draft_tokens = torch.multinomial(q.reshape(-1, vocab), 1, generator=generator).view(steps, k)  # (S, k)
        num_accepted, next_token = speculative_sampling(draft_tokens, q, p, generator=generator)
    return draft_tokens, num_accepted, next_token


@dataclass(frozen=True)
class MonteCarloResult:
    """What a Monte-Carlo run measured, each with a confidence interval.

    Args:
        gamma (`int`): tokens drafted per step.
        greedy (`bool`): greedy verification instead of speculative sampling.
        tau (`Estimate`): tokens emitted per target forward.
        acceptance_rate (`Estimate`): share of drafted tokens accepted, (tau - 1) / gamma.
        acceptance_by_position (`tuple[Estimate, ...]`): alpha_j = P(draft j accepted | drafts before it were).
        step_cost (`float`): one step's cost in target forwards (from the cost model; not simulated).
        speedup (`Estimate`): tau / step_cost.
        alpha (`float`): the rule's acceptance rate computed from the distributions themselves (mean overlap,
            or mean argmax agreement for greedy); exact for a fixed pair.
        closed_form_tau (`float`): [`expected_tokens`] at `alpha`, the value `tau` should agree with.
        emitted (`ChiSquare`, *optional*): test of the first emitted token of each step against p; only for a
            fixed pair sampled (with fresh p at every step there is no single p to test against).
    """

    gamma: int
    greedy: bool
    tau: Estimate
    acceptance_rate: Estimate
    acceptance_by_position: tuple[Estimate, ...]
    step_cost: float
    speedup: Estimate
    alpha: float
    closed_form_tau: float
    emitted: ChiSquare | None

    def to_dict(self) -> dict:
        return {
            "gamma": self.gamma,
            "greedy": self.greedy,
            "tau": self.tau.to_dict(),
            "acceptance_rate": self.acceptance_rate.to_dict(),
            "acceptance_by_position": [e.to_dict() for e in self.acceptance_by_position],
            "step_cost": self.step_cost,
            "speedup": self.speedup.to_dict(),
            "alpha": self.alpha,
            "closed_form_tau": self.closed_form_tau,
            "emitted_chi_square": None if self.emitted is None else self.emitted.to_dict(),
        }


def simulate_chain(
    gamma: int,
    *,
    num_steps: int = 20_000,
    divergence: float = 1.0,
    vocab_size: int = 32,
    pair: tuple[torch.Tensor, torch.Tensor] | None = None,
    greedy: bool = False,
    cost_ratio: float = 0.0,
    verify_cost: CostCurve | None = None,
    seed: int = 0,
    confidence: float = 0.95,
) -> MonteCarloResult:
    """Simulate `num_steps` independent speculative steps of `gamma` drafts, batched as tensors.

    Args:
        gamma (`int`): tokens drafted per step, at least 1.
        num_steps (`int`): independent steps to simulate.
        divergence (`float`): the draft's logit noise for fresh [`synthetic_pairs`] at every position.
        vocab_size (`int`): V for [`synthetic_pairs`].
        pair (`tuple` of two `torch.Tensor` of shape `(V,)`, *optional*): one fixed `(p, q)` used at every
            position instead (see [`pair_with_acceptance`]); then `divergence` and `vocab_size` are unused.
        greedy (`bool`): draft argmax q and verify with `greedy_accept`.
        cost_ratio (`float`): c, a draft forward's cost in target forwards, for the speedup.
        verify_cost (`CostCurve`, *optional*): V(n) for the speedup; flat when `None`.
        seed (`int`): seed of the `torch.Generator` that drives everything.
        confidence (`float`): level of the confidence intervals.
    """
    gamma = check_draft_length(gamma, minimum=1)
    if num_steps < 2:
        raise ValueError(f"num_steps must be at least 2 for a confidence interval, got {num_steps!r}.")
    cost = step_cost(gamma, cost_ratio, verify_cost)
    generator = torch.Generator().manual_seed(seed)
    vocab = vocab_size if pair is None else pair[0].numel()
    chunk = max(1, _MAX_ELEMENTS_PER_CHUNK // ((gamma + 1) * vocab))
    accepted: list[torch.Tensor] = []
    total_alpha = 0.0  # sum over drafted positions of the rule's acceptance probability
    first_counts = torch.zeros(vocab, dtype=torch.long)
    for start in range(0, num_steps, chunk):
        n = min(chunk, num_steps - start)
        if pair is None:
            p, q = synthetic_pairs((n, gamma + 1), vocab, divergence, generator)  # (n, g+1, V) each
            q = q[:, :gamma]  # (n, g, V): nothing is drafted after the last position
        else:
            p, q = pair[0].expand(n, gamma + 1, vocab), pair[1].expand(n, gamma, vocab)
        draft_tokens, num_accepted, next_token = draft_and_verify(p, q, generator, greedy)
        accepted.append(num_accepted)
        agree = p[:, :gamma].argmax(-1) == q.argmax(-1) if greedy else overlap(p[:, :gamma], q)  # (n, g)
        total_alpha += float(agree.double().sum())
        first = torch.where(num_accepted > 0, draft_tokens[:, 0], next_token)  # (n,) first emitted token
        first_counts += torch.bincount(first, minlength=vocab)
    num_accepted = torch.cat(accepted)  # (S,)
    alpha = total_alpha / (num_steps * gamma)
    tau = mean_estimate(num_accepted + 1.0, confidence)
    by_position = tuple(
        proportion_estimate(int((num_accepted >= j).sum()), int((num_accepted >= j - 1).sum()), confidence)
        for j in range(1, gamma + 1)
    )
    return MonteCarloResult(
        gamma=gamma,
        greedy=greedy,
        tau=tau,
        acceptance_rate=mean_estimate(num_accepted / gamma, confidence),
        acceptance_by_position=by_position,
        step_cost=cost,
        speedup=tau.scaled(1.0 / cost),
        alpha=alpha,
        closed_form_tau=expected_tokens(alpha, gamma),
        emitted=None if pair is None or greedy else chi_square_test(first_counts, pair[0]),
    )
