"""What a cost model has measured (`MeasuredCosts`), which a call hands to the next (`memory`), and the fitted line of
verification time against verified tokens it holds (`VerifyLine`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hf_specdec.generation.decisions.constants import VERIFY_LINE_DECAY


@dataclass
class MeasuredCosts:
    """What a cost model has measured (not what it holds fixed), which the next call with the same target and
    drafter starts from (`hf_specdec.generation.decisions.memory`): the costs `c`, `v`, `s` and the fitted line
    they come from, plain steps' seconds by rows, the target's prefill seconds per token, and the least advanced
    row's acceptance of chained drafts by rows (accepted drafts, rejections: exponentially weighted counts)."""

    draft_forward: float
    verify_per_token: float = 0.0
    step_overhead: float = 0.0
    verify_line: VerifyLine = field(default_factory=lambda: VerifyLine())
    plain: dict[int, float] = field(default_factory=dict)
    plain_verify: dict[int, float] = field(default_factory=dict)
    token_seconds: float | None = None
    verified_wide: bool = False
    draft_measured: bool = False
    acceptance: dict[int, tuple[float, float]] = field(default_factory=dict)


class VerifyLine:
    """Verification time as a line in the number of verified tokens, fitted by exponentially weighted
    least squares (recent steps count more: the machine's load drifts)."""

    def __init__(self) -> None:
        self._w = self._x = self._y = self._xx = self._xy = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        d = VERIFY_LINE_DECAY
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
