"""What a speculative step costs, in plain decoding steps: `CostModel`, the one cost model every decision weighs.

Three costs decide every adaptive choice, all in units of one plain decoding step (a target forward over one
token per row):

- `c`, one draft forward (a draft model's, or a head's for EAGLE heads; 0 for drafters that run no model);
- `v`, one more verified token (verification time grows with rows x tokens once the hardware is busy: on a
  GPU it barely grows up to dozens of tokens, on a CPU it grows almost from the first);
- `s`, what a step that verifies drafts costs beyond a plain step and its `v` per extra token: the target's
  forward leaving its one-token path (a mask, matrix products instead of matrix-vector ones). On a CPU the
  second verified token per row costs several times what each next one does; a line through plain steps and
  speculative ones would put that jump in `v`, so that drafts look dearer the longer they are.

`CostModel` measures them while decoding: the verification time of speculative steps is fitted as a line in the
number of verified tokens (exponentially weighted, recent steps count more), whose slope is `v` and whose value
at one token per row, above a measured plain step's, is `s`; a draft forward's time is taken relative to a plain
step's forward, and the whole step (drafting, verification and the loop's own work) is compared with a plain
step. Or it holds them fixed (`SpeculativeCosts`, for example the ones an
earlier run measured, returned in `SpeculativeStats.costs`): every decision is then a function of the tokens
alone, so seeded sampling is reproducible.

It also keeps the rate recent steps brought (tokens per plain step's worth of time, at least 1: what a plain step
brings), against which one more drafted token is weighed (`CostModel.pays`, see `hf_specdec.generation.decisions`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel

from hf_specdec.generation.decisions.constants import (
    ACCEPTANCE_DECAY,
    COST_SMOOTHING,
    PRIOR_DRAFT_ACCEPTANCE,
    PRIOR_DRAFT_WEIGHT,
    STEP_SMOOTHING,
)
from hf_specdec.generation.decisions.measured import MeasuredCosts


@dataclass(frozen=True)
class SpeculativeCosts:
    """The costs the adaptive rules weigh, in one-token target forwards (a plain decoding step).

    Pass them to `generate(..., speculative_costs=...)` to use these instead of measuring them while decoding:
    decisions then no longer depend on timings, so seeded sampling is reproducible.

    Args:
        draft_forward (`float`): `c`, one draft-model forward (ignored by prompt lookup and heads, which run none).
        verify_per_token (`float`): `v`, verifying one more token (in the whole batch).
        step_overhead (`float`): `s`, what a step that verifies drafts costs beyond a plain step and `v` per extra
            verified token (0 by default).
    """

    draft_forward: float
    verify_per_token: float
    step_overhead: float = 0.0

    def __post_init__(self) -> None:
        for name in ("draft_forward", "verify_per_token", "step_overhead"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < float("inf"):
                raise ValueError(f"SpeculativeCosts.{name} is a non-negative number of target forwards, got {value!r}.")

    def step(self, draft_forwards: float, rows: int, verified_per_row: float) -> float:
        """A step's predicted cost in plain steps: its draft forwards, then verifying `verified_per_row` tokens
        for each of `rows` rows (one per row is a plain step; more pay `s` once)."""
        extra = verified_per_row - 1
        overhead = self.step_overhead if extra > 0 else 0.0
        return self.draft_forward * draft_forwards + 1.0 + overhead + self.verify_per_token * rows * extra


class CostModel:
    """Measures (or holds fixed) `c`, `v` and `s`, the time of a plain step, and the running rate of recent steps
    (tokens per plain step, from the step costs measured or, when fixed, predicted from the tokens alone).

    Args:
        draft_forward (`float`): the first estimate of `c` (for a draft model, its share of the target's
            parameters; 0 for drafters that run no model).
        fixed (`SpeculativeCosts`, *optional*): costs to use instead of measurements.
    """

    def __init__(self, draft_forward: float = 0.0, fixed: SpeculativeCosts | None = None) -> None:
        if not draft_forward >= 0.0:
            raise ValueError(f"The draft's cost ratio must be non-negative, got {draft_forward!r}.")
        self.fixed = fixed
        # A draft's share of the target's compute, for its prefill (bound by compute, not by reading weights).
        self.prefill_share = draft_forward
        self._m = MeasuredCosts(draft_forward)  # what is measured (with fixed costs: those, never measured)
        if fixed is not None:
            self._m.draft_forward, self._m.verify_per_token = fixed.draft_forward, fixed.verify_per_token
            self._m.step_overhead = fixed.step_overhead
        self._gain: float | None = None  # tokens recent speculative steps gave the least advanced row
        self._cost: float | None = None  # their cost in plain steps
        self._all_gain: float | None = None  # the same over every step, plain ones included (1 token, 1 step)
        self._all_cost: float | None = None
        # Where `keep` hands what was measured (`memory.remembered_costs`): `None`, kept nowhere.
        self.keeper: Callable[[MeasuredCosts], None] | None = None

    @classmethod
    def verification_only(cls, fixed: SpeculativeCosts | None = None) -> CostModel:
        """The cost model of drafters that run no model (prompt lookup, Medusa heads): no draft forward to pay
        for (c = 0); `fixed`'s `verify_per_token` instead of measuring it."""
        return cls(0.0, None if fixed is None else SpeculativeCosts(0.0, fixed.verify_per_token, fixed.step_overhead))

    @property
    def draft_forward(self) -> float:
        """`c`: one draft-model forward, in plain steps."""
        return self._m.draft_forward

    @property
    def verify_per_token(self) -> float:
        """`v`: one more verified token in the batch, in plain steps."""
        return self._m.verify_per_token

    @property
    def step_overhead(self) -> float:
        """`s`: what a step that verifies drafts costs beyond a plain step and `v` per extra token, in plain steps."""
        return self._m.step_overhead

    @property
    def estimated(self) -> SpeculativeCosts:
        """The costs in use: the fixed ones, or the current estimates."""
        return self.fixed or SpeculativeCosts(self._m.draft_forward, self._m.verify_per_token, self._m.step_overhead)

    def observe(
        self, draft_seconds: float, draft_forwards: int, verify_seconds: float, rows: int, verified_per_row: int
    ) -> None:
        """Refine `c`, `v` and `s` from one step: `draft_forwards` draft forwards took `draft_seconds`, verifying
        `verified_per_row` tokens for each of `rows` rows took `verify_seconds` (one per row: a plain step's
        forward, which speculative steps' verification is compared with). Nothing changes when fixed."""
        if verify_seconds <= 0 or self.fixed is not None:
            return
        if verified_per_row <= 1:
            self._m.plain_verify[rows] = _smooth(self._m.plain_verify.get(rows), verify_seconds)
            return
        self._m.verified_wide = True
        self._m.verify_line.add(rows * verified_per_row, verify_seconds)
        line = self._m.verify_line
        plain, fitted, slope = self._m.plain_verify.get(rows), line.predict(rows), line.slope
        if fitted is None:  # one verify size so far: no slope; against a plain step, all of the growth is `v`
            slope = 0.0 if plain is None else max(verify_seconds - plain, 0.0) / (rows * (verified_per_row - 1))
        one_token = plain or fitted or verify_seconds
        self._m.verify_per_token = slope / one_token
        if plain is not None and fitted is not None:
            self._m.step_overhead = max(fitted - plain, 0.0) / plain
        if draft_forwards > 0:
            self._m.draft_measured = True
            ratio = draft_seconds / draft_forwards / one_token
            self._m.draft_forward += COST_SMOOTHING * (ratio - self._m.draft_forward)

    def observe_draft_probe(self, seconds: float, rows: int) -> None:
        """One draft forward over one token in each of `rows` rows took `seconds`, timed before the draft was
        started (`DraftModelDrafter` probes it once): `c` against a plain step's forward of those rows, measured
        instead of taken from the draft's share of the parameters (which small models on a CPU run less
        efficiently than large ones). Nothing changes when fixed or before a plain step was measured."""
        one = self._m.plain_verify.get(rows) or self._m.plain.get(rows)
        if self.fixed is not None or one is None or one <= 0 or seconds <= 0:
            return
        self._m.draft_forward, self._m.draft_measured = seconds / one, True

    @property
    def draft_measured(self) -> bool:
        """Whether `c` comes from a timed draft forward (or is fixed), not from the draft's parameter share."""
        return self.fixed is not None or self._m.draft_measured

    def observe_acceptance(self, rows: int, accepted: int, drafted: int) -> None:
        """The least advanced row of a batch of `rows` rows had `accepted` of a chain's `drafted` drafts accepted
        (a draft model's chain: what `acceptance` estimates). Recorded with fixed costs too: it is no cost."""
        if drafted <= 0:
            return
        successes, failures = self._m.acceptance.get(rows, (0.0, 0.0))
        rejected = 1.0 if accepted < drafted else 0.0
        decay = ACCEPTANCE_DECAY
        self._m.acceptance[rows] = (decay * successes + accepted, decay * failures + rejected)

    def acceptance(self, rows: int) -> float:
        """The chance that the least advanced row of `rows` rows accepts a chained draft, after the ones before it
        (each draft a success, each rejection a failure: the estimate of a geometric run, censored where a whole
        chain was accepted), starting from `PRIOR_DRAFT_ACCEPTANCE` with `PRIOR_DRAFT_WEIGHT` drafts' weight."""
        successes, failures = self._m.acceptance.get(rows, (0.0, 0.0))
        prior = PRIOR_DRAFT_WEIGHT
        return (successes + PRIOR_DRAFT_ACCEPTANCE * prior) / (successes + failures + prior)

    def measured(self) -> MeasuredCosts:
        """A copy of what this model has measured (see `MeasuredCosts`)."""
        return copy.deepcopy(self._m)

    def keep(self) -> None:
        """Hand what was measured to the next call (`memory.remembered_costs`), where a keeper is set."""
        if self.keeper is not None:
            self.keeper(self.measured())

    def recall(self, measured: MeasuredCosts) -> None:
        """Start from what an earlier call measured (a copy of it); nothing changes when costs are fixed."""
        if self.fixed is None:
            self._m = copy.deepcopy(measured)

    def observe_step(self, gained: float, cost: float, speculative: bool = True) -> None:
        """A step gave the least advanced row `gained` tokens and cost `cost` plain steps; `speculative`: it
        verified drafts (a plain step, or one in which nothing was drafted, counts toward `rate` only)."""
        self._all_gain, self._all_cost = _smooth(self._all_gain, gained), _smooth(self._all_cost, cost)
        if speculative:
            self._gain, self._cost = _smooth(self._gain, gained), _smooth(self._cost, cost)

    @property
    def step_rate(self) -> float | None:
        """Tokens recent speculative steps gave the least advanced row per plain step of their time (running
        means of both); `None` before the first."""
        if self._gain is None or self._cost is None or self._cost <= 0:
            return None
        return self._gain / self._cost

    @property
    def rate(self) -> float:
        """The tokens per plain step a drafted token must beat (see the module's docstring): what recent steps
        brought, plain ones included (a stretch with nothing to draft brings the rate back to 1, so a lookup
        that found nothing for a while drafts again at its first good match), and at least 1 (what plain steps
        bring); 1 before any step."""
        if self._all_gain is None or self._all_cost is None or self._all_cost <= 0:
            return 1.0
        return max(1.0, self._all_gain / self._all_cost)

    def verify_cost(self, rows: int) -> float:
        """`v` as the decisions for a batch of `rows` rows weigh it: measured (or fixed), or before any step
        verified drafts, what the target's prefill spent per token over a plain step of `rows` rows (a forward
        over more tokens costs at least their compute); 0 before either is known."""
        if self.fixed is not None or self._m.verified_wide:
            return self._m.verify_per_token
        plain = self._m.plain.get(rows)
        if plain is None or plain <= 0 or self._m.token_seconds is None:
            return self._m.verify_per_token
        return self._m.token_seconds / plain

    def threshold(self, rows: int, draft_forwards: int = 0) -> float:
        """The least expected gain, in tokens per row, that pays for drafting one more token per row (or one
        more tree node, or depth): what it costs in plain steps, `draft_forwards` draft forwards (`c` each) and one
        more verified token in each of `rows` rows (`v * rows`), times `rate` (the module's docstring of
        `hf_specdec.generation.decisions`)."""
        return self.rate * (self._m.draft_forward * draft_forwards + self.verify_cost(rows) * rows)

    def step_threshold(self) -> float:
        """The least expected gain, in tokens per row, that the drafts of a step must bring together on top of
        their own `threshold`s: the step's fixed cost `s`, times `rate`."""
        return self.rate * self.estimated.step_overhead

    def pays(self, gain: float | Callable[[], float], rows: int, draft_forwards: int = 0) -> bool:
        """Whether one more drafted token per row (or tree node, or depth) that is expected to bring `gain`
        tokens per row pays for itself: the one question every adaptive rule asks (`threshold`). A gain the host
        must read from the device may be given as a function, called only when the answer depends on it (not when
        the threshold is 0, where every gain pays)."""
        threshold = self.threshold(rows, draft_forwards)
        if callable(gain):
            return threshold <= 0.0 or gain() >= threshold
        return gain >= threshold

    def step(self, draft_forwards: float, rows: int, verified_per_row: float) -> float:
        """A step's predicted cost in plain steps, from the costs in use (`SpeculativeCosts.step`, with
        `verify_cost`)."""
        if self.fixed is not None:
            return self.fixed.step(draft_forwards, rows, verified_per_row)
        costs = SpeculativeCosts(self._m.draft_forward, self.verify_cost(rows), self._m.step_overhead)
        return costs.step(draft_forwards, rows, verified_per_row)

    def observe_plain(self, seconds: float, rows: int) -> None:
        """A plain step (one token per row) of `rows` rows took `seconds`, all of the step's work included."""
        if self.fixed is not None:
            return
        self._m.plain[rows] = _smooth(self._m.plain.get(rows), seconds)

    def observe_prefill(self, seconds: float, tokens: int) -> None:
        """The target's prefill fed `tokens` tokens (padding included) in `seconds`: what a token costs where a
        forward is bound by compute, the first estimate of what verifying more tokens costs, and of a draft's own
        prefill (`hf_specdec.generation.decisions.setup_costs`)."""
        if self.fixed is None and tokens > 0 and seconds > 0:
            self._m.token_seconds = seconds / tokens

    @property
    def token_seconds(self) -> float | None:
        """Seconds the target's prefill took per token fed (`observe_prefill`); `None` before it, or when fixed."""
        return self._m.token_seconds

    @property
    def verified_wide(self) -> bool:
        """Whether `verify_per_token` and `step_overhead` come from a step that verified drafts (or are fixed)."""
        return self.fixed is not None or self._m.verified_wide

    def plain_seconds(self, rows: int) -> float | None:
        """The measured time of a plain step of `rows` rows, all of the step's work included; `None` before one."""
        return self._m.plain.get(rows)

    def knows_plain(self, rows: int) -> bool:
        """Whether a plain step of `rows` rows has been measured (or costs are fixed: nothing to measure)."""
        return self.fixed is not None or rows in self._m.plain

    def in_plain_steps(
        self, seconds: float, draft_forwards: int, rows: int, verified_per_row: int, verify_seconds: float
    ) -> float:
        """What a step cost, in plain steps of the same rows: measured (its `seconds` over a plain step's), or
        predicted from the fixed costs."""
        if self.fixed is not None:
            return self.fixed.step(draft_forwards, rows, verified_per_row)
        plain = self._m.plain.get(rows)
        if plain is None:  # not measured yet: the fitted verification of one token per row
            plain = self._m.verify_line.predict(rows)
        if plain is None:  # no line yet either: this step's verification stands for a plain forward
            plain = verify_seconds / self.estimated.step(0, rows, verified_per_row)
        return seconds / plain if plain > 0 else 1.0


def _smooth(mean: float | None, value: float) -> float:
    """A running mean of recent steps (the first value, then exponentially weighted)."""
    return value if mean is None else mean + STEP_SMOOTHING * (value - mean)


def parameter_share(draft: nn.Module, target: PreTrainedModel, extra: int = 0) -> float:
    """The draft's size relative to the target's (plus `extra` weights it reads, such as the target's lm_head rows
    that heads project onto): the first guess of `c`, a draft forward's cost, when decoding is bound by reading
    the weights."""
    return (weight_count(draft) + extra) / max(weight_count(target), 1)


def weight_count(model: nn.Module) -> int:
    """The module's parameters, counting the weights quantised layers pack away from `parameters()` (torch's
    dynamically quantised `Linear` keeps them behind a `weight()` method)."""
    count = sum(p.numel() for p in model.parameters())
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if callable(weight) and not isinstance(weight, torch.Tensor):
            count += weight().numel()
    return count
