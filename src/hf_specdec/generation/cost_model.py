"""What a speculative step costs, in plain decoding steps, and whether it pays for itself.

Two costs decide every adaptive choice, both in units of one plain decoding step (a target forward over one
token per row):

- `c`, one draft-model forward;
- `v`, one more verified token (verification time grows with rows x tokens once the hardware is busy: on a
  GPU it barely grows up to dozens of tokens, on a CPU it grows almost from the first).

`CostModel` measures them while decoding: verification time is fitted as a line in the number of verified
tokens (exponentially weighted, recent steps count more), a draft forward's time is taken relative to the
fitted time of a one-token-per-row forward, and the whole step (drafting, verification and the loop's own
work) is compared with a plain step. Or it holds them fixed (`SpeculativeCosts`, for example the ones an
earlier run measured, returned in `SpeculativeStats.costs`): every decision is then a function of the tokens
alone, so seeded sampling is reproducible.

Every adaptive length rule (a chain's next draft, a tree's next depth, a lookup's width) weighs what one more
drafted token is expected to bring against what it costs, and asks for more than break-even: a step's time could
instead go to steps of the kind recent ones were, which brought `rate` tokens per plain step's worth of time
(`CostModel.rate`, at least 1: a plain step brings one). Drafting one more token pays when its expected gain is at
least `rate` times its cost (`CostModel.draft_threshold`): the rule that maximises tokens per second over many
steps (the ratio of expected tokens to expected time; Dinkelbach's method for a ratio, the current rate standing
for the best one). Break-even (gain >= cost) would keep drafting where one more token brings less per second
than the step already does (Qwen2.5-Coder 1.5B/0.5B at batch 1 on a CPU, where a draft forward costs 45% of a
target one: chains drafted 3.97 tokens a step, 79-89% of them accepted, against 3.25 and 87-92% now, for the same
speed; docs/benchmarks.md, session 14).

`SpeculationGate` uses the model to decide, step by step, between a speculative step and a plain one-token
step: a drafter's step advances the batch's least advanced row by `g` tokens (a batched call ends with its
last row, so rows ahead of it finishing sooner barely shortens it) and costs `C` plain steps of the same rows.
When `g` falls clearly below `C` on average over recent steps (below 80% of it: at batch 4 on a CPU, verifying
several tokens per row can cost more than the drafts bring), the loop takes plain steps instead, and tries
drafting again after a while (sooner when it last paid), since what drafts bring changes with the text (a
reply that starts quoting its prompt) and what verification costs changes with the rows left in the batch.
Near break-even drafting goes on: a plain step learns nothing about the text and would miss the easy stretch
that follows. A plain step of each batch size is measured once before it is compared with.
"""

from __future__ import annotations

from dataclasses import dataclass

# Weight of the newest measurement in running estimates (the draft/target cost ratio; tokens and costs of
# speculative steps; the time of plain steps).
_SMOOTHING = 0.2
_STEP_SMOOTHING = 0.3
# After a speculative step that did not pay, the gate takes this many plain steps before trying again, doubling
# each time a retry does not pay either, up to the most.
_FIRST_PATIENCE = 2
_MOST_PATIENCE = 32
# Drafting stops only when it clearly loses: recent steps brought less than this share of what they cost. Near
# break-even it goes on (a plain step learns nothing about the text, and misses the easy stretch that follows).
_CLEAR_LOSS = 0.8


@dataclass(frozen=True)
class SpeculativeCosts:
    """The costs the adaptive rules weigh, in one-token target forwards (a plain decoding step).

    Pass them to `generate(..., speculative_costs=...)` to use these instead of measuring them while decoding:
    decisions then no longer depend on timings, so seeded sampling is reproducible.

    Args:
        draft_forward (`float`): `c`, one draft-model forward (ignored by prompt lookup and heads, which run none).
        verify_per_token (`float`): `v`, verifying one more token (in the whole batch).
    """

    draft_forward: float
    verify_per_token: float

    def __post_init__(self) -> None:
        for name in ("draft_forward", "verify_per_token"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < float("inf"):
                raise ValueError(f"SpeculativeCosts.{name} is a non-negative number of target forwards, got {value!r}.")

    def step(self, draft_forwards: int, rows: int, verified_per_row: int) -> float:
        """A step's predicted cost in plain steps: its draft forwards, then verifying `verified_per_row` tokens
        for each of `rows` rows (one per row is a plain step)."""
        return self.draft_forward * draft_forwards + 1.0 + self.verify_per_token * rows * (verified_per_row - 1)


class CostModel:
    """Measures (or holds fixed) `c` and `v`, the time of a plain step, and the running rate of recent steps
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
        self._draft_forward = draft_forward if fixed is None else fixed.draft_forward
        self._verify_per_token = 0.0 if fixed is None else fixed.verify_per_token
        self._verify = _VerifyLine()
        self._plain: dict[int, float] = {}  # seconds of a plain step, by rows in the batch (running means)
        self._gain: float | None = None  # tokens recent speculative steps gave the least advanced row
        self._cost: float | None = None  # their cost in plain steps
        self._all_gain: float | None = None  # the same over every step, plain ones included (1 token, 1 step)
        self._all_cost: float | None = None

    @property
    def draft_forward(self) -> float:
        """`c`: one draft-model forward, in plain steps."""
        return self._draft_forward

    @property
    def verify_per_token(self) -> float:
        """`v`: one more verified token in the batch, in plain steps."""
        return self._verify_per_token

    @property
    def estimated(self) -> SpeculativeCosts:
        """The costs in use: the fixed ones, or the current estimates."""
        return self.fixed or SpeculativeCosts(self._draft_forward, self._verify_per_token)

    def observe(
        self, draft_seconds: float, draft_forwards: int, verify_seconds: float, rows: int, verified_per_row: int
    ) -> None:
        """Refine `c` and `v` from one step: `draft_forwards` draft forwards took `draft_seconds`, verifying
        `verified_per_row` tokens for each of `rows` rows took `verify_seconds`. Nothing changes when fixed."""
        if verify_seconds <= 0 or self.fixed is not None:
            return
        self._verify.add(rows * verified_per_row, verify_seconds)
        one_token, per_token = self._verify.predict(rows), self._verify.slope
        if one_token is None:  # too few different verify sizes yet: compare with the whole verification
            one_token, per_token = verify_seconds, 0.0
        self._verify_per_token = per_token / one_token
        if draft_forwards > 0:
            ratio = draft_seconds / draft_forwards / one_token
            self._draft_forward += _SMOOTHING * (ratio - self._draft_forward)

    def extra_draft(self, rows: int) -> float:
        """What drafting one more token per row costs, in plain steps: a draft forward (`c`) and one more
        verified token in each of `rows` rows (`v * rows`)."""
        return self._draft_forward + self._verify_per_token * rows

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

    def draft_threshold(self, rows: int) -> float:
        """The least expected gain, in tokens per row, that pays for drafting one more token per row with a
        draft model: its cost in plain steps (`extra_draft`) times `rate`."""
        return self.rate * self.extra_draft(rows)

    def verify_threshold(self, rows: int) -> float:
        """The least expected gain, in tokens per row, that pays for verifying one more token per row (a drafter
        that runs no model, as prompt lookup): `v * rows` times `rate`."""
        return self.rate * self._verify_per_token * rows

    def observe_plain(self, seconds: float, rows: int) -> None:
        """A plain step (one token per row) of `rows` rows took `seconds`, all of the step's work included."""
        if self.fixed is not None:
            return
        self._plain[rows] = _smooth(self._plain.get(rows), seconds)

    def knows_plain(self, rows: int) -> bool:
        """Whether a plain step of `rows` rows has been measured (or costs are fixed: nothing to measure)."""
        return self.fixed is not None or rows in self._plain

    def in_plain_steps(
        self, seconds: float, draft_forwards: int, rows: int, verified_per_row: int, verify_seconds: float
    ) -> float:
        """What a step cost, in plain steps of the same rows: measured (its `seconds` over a plain step's), or
        predicted from the fixed costs."""
        if self.fixed is not None:
            return self.fixed.step(draft_forwards, rows, verified_per_row)
        plain = self._plain.get(rows)
        if plain is None:  # not measured yet: the fitted verification of one token per row
            plain = self._verify.predict(rows)
        if plain is None:  # no line yet either: this step's verification stands for a plain forward
            plain = verify_seconds / (1.0 + self._verify_per_token * rows * (verified_per_row - 1))
        return seconds / plain if plain > 0 else 1.0


class SpeculationGate:
    """Decides, step by step, whether to draft or to take a plain one-token step (see the module's docstring).

    Args:
        costs (`CostModel`): the loop's cost model.
        enabled (`bool`): when `False`, every step drafts (the gate only measures).
    """

    def __init__(self, costs: CostModel, enabled: bool = True) -> None:
        self.costs = costs
        self.enabled = enabled
        self._patience = _FIRST_PATIENCE
        self._wait = 0  # plain steps left before drafting again
        self.plain_steps = 0

    def speculate(self, rows: int) -> bool:
        """Whether the next step of `rows` rows drafts (else the loop verifies each row's last token alone)."""
        explore = self.enabled and self.costs.step_rate is not None and not self.costs.knows_plain(rows)
        if self._wait > 0 or explore:  # explore: after a first step that drafted, measure one plain step
            self._wait = max(self._wait - 1, 0)
            self.plain_steps += 1
            return False
        return True

    def observe(
        self,
        gained: float,
        seconds: float,
        draft_forwards: int,
        rows: int,
        verified_per_row: int,
        verify_seconds: float,
    ) -> None:
        """Record a step: the least advanced row gained `gained` tokens; the step (drafting, verification and the
        loop's work) took `seconds`, with `draft_forwards` draft forwards and `verified_per_row` tokens verified
        per row, of which `verify_seconds` verifying. A step in which no row drafted (the gate's plain steps, or
        a drafter that found nothing) is a plain step: it measures what plain steps take."""
        if verified_per_row <= 1:
            self.costs.observe_plain(seconds, rows)
            self.costs.observe_step(gained, 1.0, speculative=False)
            return
        self.costs.observe_step(
            gained, self.costs.in_plain_steps(seconds, draft_forwards, rows, verified_per_row, verify_seconds)
        )
        step_rate = self.costs.step_rate
        assert step_rate is not None
        if step_rate >= _CLEAR_LOSS or not self.enabled:
            self._patience = _FIRST_PATIENCE
        else:  # drafting lost: plain steps for a while, and longer each time it loses again
            self._wait = self._patience
            self._patience = min(2 * self._patience, _MOST_PATIENCE)


def _smooth(mean: float | None, value: float) -> float:
    """A running mean of recent steps (the first value, then exponentially weighted)."""
    return value if mean is None else mean + _STEP_SMOOTHING * (value - mean)


class _VerifyLine:
    """Verification time as a line in the number of verified tokens, fitted by exponentially weighted
    least squares (recent steps count more: the machine's load drifts)."""

    _DECAY = 0.9

    def __init__(self) -> None:
        self._w = self._x = self._y = self._xx = self._xy = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        d = self._DECAY
        self._w = d * self._w + 1.0
        self._x = d * self._x + tokens
        self._y = d * self._y + seconds
        self._xx = d * self._xx + tokens * tokens
        self._xy = d * self._xy + tokens * seconds

    @property
    def slope(self) -> float:
        variance = self._xx / self._w - (self._x / self._w) ** 2
        if variance <= 1e-9:
            return 0.0
        covariance = self._xy / self._w - (self._x / self._w) * (self._y / self._w)
        return max(covariance / variance, 0.0)

    def predict(self, tokens: int) -> float | None:
        """Fitted seconds for `tokens` verified tokens, or `None` before two different sizes were seen."""
        if self._w == 0.0 or self._xx / self._w - (self._x / self._w) ** 2 <= 1e-9:
            return None
        mean_x, mean_y = self._x / self._w, self._y / self._w
        fitted = mean_y + self.slope * (tokens - mean_x)
        return fitted if fitted > 0 else None
