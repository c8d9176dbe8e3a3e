"""What one target forward costs as a function of the number of tokens it verifies.

Leviathan et al. assume verifying n tokens costs what one token costs. That holds while a forward is
bound by streaming the weights from memory and stops holding once the arithmetic of n tokens takes
longer than the weight traffic. A `CostCurve` carries measured (or modelled) times at a few token
counts and interpolates between them, so the closed forms can use real verification costs.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CostCurve:
    """Time of one target forward over `n` new tokens, measured at a few `n`.

    Args:
        tokens (`tuple[int, ...]`): strictly increasing token counts, starting at 1.
        times (`tuple[float, ...]`): the time of a forward over each count, in any unit (`unit`).
        unit (`str`): the unit of `times`, for display only.
        source (`str`): where the figures come from.

    Calling the curve with `n` returns the cost relative to a forward over one token: `times` linearly
    interpolated at `n`, divided by `times[0]`. Past the last point the last segment is extended (a
    forward bound by arithmetic grows linearly in `n`), never downwards; a single point is a flat curve.
    """

    tokens: tuple[int, ...]
    times: tuple[float, ...]
    unit: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        tokens, times = tuple(self.tokens), tuple(float(t) for t in self.times)
        if len(tokens) == 0 or len(tokens) != len(times):
            raise ValueError(
                f"A cost curve needs one time per token count, got {len(tokens)} counts and {len(times)} times."
            )
        if any(n != int(n) for n in tokens) or any(b <= a for a, b in itertools.pairwise(tokens)):
            raise ValueError(f"Token counts must be strictly increasing integers, got {tokens}.")
        if tokens[0] != 1:
            raise ValueError(
                "A cost curve must start at 1 token (the plain decoding step every cost is relative to), "
                f"got token counts {tokens}."
            )
        object.__setattr__(self, "tokens", tuple(int(n) for n in tokens))
        object.__setattr__(self, "times", times)
        if any(not (math.isfinite(t) and t > 0) for t in self.times):
            raise ValueError(f"Forward times must be finite and > 0, got {self.times}.")

    @classmethod
    def flat(cls) -> CostCurve:
        """Leviathan et al.'s assumption: verifying any number of tokens costs one forward."""
        return cls(tokens=(1,), times=(1.0,), source="flat: verification costs one forward at any length")

    @classmethod
    def from_points(cls, points: dict[int, float] | Sequence[tuple[int, float]], **kwargs: str) -> CostCurve:
        """Build a curve from `{tokens: time}` or `[(tokens, time), ...]`, in any order."""
        items = sorted(points.items() if isinstance(points, dict) else points)
        return cls(tokens=tuple(int(n) for n, _ in items), times=tuple(t for _, t in items), **kwargs)

    def time(self, num_tokens: float) -> float:
        """The interpolated time of a forward over `num_tokens` tokens, in `unit`."""
        if not num_tokens >= 1:
            raise ValueError(f"A forward verifies at least 1 token, got {num_tokens!r}.")
        if len(self.tokens) == 1:
            return self.times[0]
        i = bisect.bisect_right(self.tokens, num_tokens) - 1
        i = min(i, len(self.tokens) - 2)  # past the last point: extend the last segment
        (n0, n1), (t0, t1) = self.tokens[i : i + 2], self.times[i : i + 2]
        slope = (t1 - t0) / (n1 - n0)
        if num_tokens > n1:
            return t1 + max(slope, 0.0) * (num_tokens - n1)  # never extrapolate a cost downwards
        return t0 + slope * (num_tokens - n0)

    def __call__(self, num_tokens: float) -> float:
        """Cost of a forward over `num_tokens` tokens relative to a forward over one token."""
        return self.time(num_tokens) / self.times[0]


CPU_QWEN_1_5B_BF16 = CostCurve(
    tokens=(1, 2, 4, 8, 16, 32, 64),
    times=(139.0, 119.0, 121.0, 140.0, 176.0, 235.0, 348.0),
    unit="ms",
    source=(
        "Qwen2.5-Coder-1.5B-Instruct, bf16, 2 CPU threads (AMD EPYC with avx512_bf16), one forward over n new "
        "tokens after a 300-token cached prefix; measured on a 2-core CPU (docs/simulator.md)"
    ),
)
"""Measured verification cost on a 2-core CPU: 8 tokens cost what 1 costs, 64 cost 2.5x."""
