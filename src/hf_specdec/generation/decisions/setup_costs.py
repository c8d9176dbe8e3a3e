"""Whether a draft model is worth starting at all: its prefill against what it can save over the tokens left.

A draft model costs something before its first draft: its forward over the prompts. At batch 1 on a GPU that is
a few milliseconds; in a batch on a CPU, where a forward over many tokens is bound by compute, it is the draft's
share of the target's prefill, which can outweigh every step a draft could save (Qwen2.5-Coder-1.5B with its 0.5B
draft, float32 on a 2-core AVX2 CPU, 8 prompts of about 300 tokens: the target's prefill takes over a minute, the
draft's about a third of that, plain decoding of 64 tokens half a minute). So the draft's prefill waits until a step
would draft with it (`DraftModelDrafter` defers it), and that step first asks `draft_model_pays`: is the best
rate a chain can be expected to bring, over the tokens the least advanced row has left, enough to pay for the
prefill?

Before a step has verified drafts, verifying them is priced from the target's own prefill
(`CostModel.verify_cost`: a forward over more tokens costs at least their compute); once a step has, as measured.
Acceptance is the least advanced row's, as measured by this call or an earlier one with the same target and draft
(`CostModel.acceptance`, `hf_specdec.generation.decisions.memory`), `PRIOR_DRAFT_ACCEPTANCE` before any.
"""

from __future__ import annotations

from collections.abc import Callable

from hf_specdec.generation.decisions.constants import MOST_JUDGED_DRAFTS
from hf_specdec.generation.decisions.costs import CostModel


def chain_rate(costs: CostModel, rows: int, most: int, acceptance: float | None = None) -> float | None:
    """The best expected rate, in tokens of the least advanced row per plain step of time, of a draft model's
    chains of 1 to `most` drafts, each accepted with chance `acceptance` (after the ones before it; by default
    `CostModel.acceptance`); `None` when neither a measured verification cost nor a plain step to price it against
    is known."""
    if acceptance is None:
        acceptance = costs.acceptance(rows)
    verify = _verify_cost(costs, rows)
    if verify is None:
        return None
    best = 0.0
    for k in range(1, max(1, min(most, MOST_JUDGED_DRAFTS)) + 1):
        tokens = sum(acceptance**i for i in range(k + 1))  # the target's own token, then each accepted draft
        best = max(best, tokens / (costs.draft_forward * k + verify(k)))
    return best


def draft_model_pays(costs: CostModel, rows: int, tokens_left: int, prefill_tokens: int) -> bool | None:
    """Whether starting a draft model is expected to pay: its chains bring more than plain steps do, and what
    they save over the `tokens_left` tokens of the least advanced row exceeds its prefill over `prefill_tokens`
    prompt tokens (the draft's share of the target's compute per token, `CostModel.prefill_share`). `None`: not
    known yet (no plain step of `rows` rows measured). With fixed costs only the first condition counts."""
    rate = chain_rate(costs, rows, tokens_left)
    if rate is None:
        return None
    if rate <= 1.0:
        return False
    saved = tokens_left * (1.0 - 1.0 / rate)  # plain steps: tokens_left of them, against tokens_left / rate
    return saved > _prefill_steps(costs, rows, prefill_tokens)


def _verify_cost(costs: CostModel, rows: int) -> Callable[[int], float] | None:
    """The cost in plain steps of a step verifying `k` drafts per row (`k -> cost`), or `None` before a plain step
    of `rows` rows was measured (nothing to price a step against)."""
    if not costs.verified_wide and costs.plain_seconds(rows) is None:
        return None
    return lambda k: costs.step(0, rows, 1 + k)


def _prefill_steps(costs: CostModel, rows: int, prefill_tokens: int) -> float:
    """The draft's prefill in plain steps of `rows` rows: 0 with fixed costs or before a prefill was measured."""
    plain, token = costs.plain_seconds(rows), costs.token_seconds
    if costs.fixed is not None or plain is None or plain <= 0 or token is None:
        return 0.0
    return costs.prefill_share * prefill_tokens * token / plain
