"""What speculative steps achieved on real models and prompts, kept so that other hardware can be predicted.

How many tokens a step commits depends on the models and the text, not on the hardware; what a step costs depends
on the hardware. `acceptance_record.json` (beside this module) holds, per method, the counts of greedy runs of a
real target and draft on real prompts (written by `tools/acceptance_record.py`): steps, tokens committed, draft
forwards and the width of every verification forward. `hf-specdec gpu` times the forwards on a device and
combines the two into a predicted speedup (`StepRecord.predicted_speedup`).

Every recorded run drafts at fixed settings with free costs (`speculative_costs=SpeculativeCosts(0, 0)`), so
every step drafts in full and the counts do not depend on the timings of the machine that recorded them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

from hf_specdec.generation.outputs import SpeculativeStats

RECORD_FILE = "acceptance_record.json"


@dataclass(frozen=True)
class StepRecord:
    """The counts of one method's recorded runs, summed over prompts.

    Args:
        method (`str`): a short name (`draft-chain-8`, `draft-tree-16`, `lookup-10`, ...).
        arguments (`str`): the `generate()` arguments that define it, as text.
        steps (`int`): verification forwards.
        tokens (`int`): tokens the verification steps committed.
        draft_forwards (`int`): forwards of the draft model.
        verify_widths (`dict[int, int]`): `{tokens verified per row: steps}`.
        drafted_at_position / accepted_at_position (`list[int]`): steps that drafted a j-th token, and that
            accepted drafts 1..j (a chain's per-position acceptance; see `truncated`).
    """

    method: str
    arguments: str
    steps: int
    tokens: int
    draft_forwards: int
    verify_widths: dict[int, int]
    drafted_at_position: list[int] = field(default_factory=list)
    accepted_at_position: list[int] = field(default_factory=list)

    @classmethod
    def from_stats(cls, method: str, arguments: str, stats: SpeculativeStats) -> StepRecord:
        return cls(
            method,
            arguments,
            int(stats.target_forwards.sum()),
            int(stats.emitted_tokens.sum()),
            stats.draft_forwards,
            dict(stats.verify_widths),
            [int(n) for n in stats.drafted_at_position],
            [int(n) for n in stats.accepted_at_position],
        )

    def merged(self, other: StepRecord) -> StepRecord:
        """The counts of both records' runs together."""
        widths = dict(self.verify_widths)
        for width, steps in other.verify_widths.items():
            widths[width] = widths.get(width, 0) + steps
        return StepRecord(
            self.method,
            self.arguments,
            self.steps + other.steps,
            self.tokens + other.tokens,
            self.draft_forwards + other.draft_forwards,
            widths,
            _add(self.drafted_at_position, other.drafted_at_position),
            _add(self.accepted_at_position, other.accepted_at_position),
        )

    @property
    def tau(self) -> float:
        """Tokens committed per verification step."""
        return self.tokens / self.steps

    def truncated(self, gamma: int) -> StepRecord:
        """A chain drafting at most `gamma` tokens per step, from a chain that drafted more: a step commits its
        accepted drafts among the first `gamma` plus one token of the target's (those that accepted all `gamma`
        commit the bonus token instead of the `gamma + 1`-th draft), drafts `min(L, gamma)` and verifies
        `min(L, gamma) + 1` tokens."""
        drafted, accepted = self.drafted_at_position[:gamma], self.accepted_at_position[:gamma]
        at_least = [self.steps, *drafted, 0]  # steps that drafted >= 0, 1, ..., gamma tokens, then > gamma: none
        widths = {n + 1: at_least[n] - at_least[n + 1] for n in range(len(at_least) - 1)}
        return StepRecord(
            f"{self.method}@{gamma}",
            f"{self.arguments}, at most {gamma} drafted",
            self.steps,
            self.steps + sum(accepted),
            sum(drafted),
            {width: steps for width, steps in widths.items() if steps},
            drafted,
            accepted,
        )

    def predicted_speedup(
        self, verify: Callable[[int], float], draft: float, host_step: float, plain_host_step: float
    ) -> float:
        """Plain decoding's time per token over this method's, from what a device's forwards cost.

        Args:
            verify (`Callable[[int], float]`): seconds of one target forward over `n` tokens per row.
            draft (`float`): seconds of one draft forward (one token per row).
            host_step (`float`), plain_host_step (`float`): the host's own seconds per step of this method and of
                plain decoding, outside the forwards.
        """
        verifying = sum(steps * verify(width) for width, steps in self.verify_widths.items())
        step = (verifying + self.draft_forwards * draft) / self.steps + host_step
        return self.tau * (verify(1) + plain_host_step) / step

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["verify_widths"] = {str(k): v for k, v in sorted(self.verify_widths.items())}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepRecord:
        return cls(**{**data, "verify_widths": {int(k): int(v) for k, v in data["verify_widths"].items()}})


def load_record() -> tuple[dict[str, Any], list[StepRecord]]:
    """The recorded setting (models, prompts, dtype, when) and the methods' counts."""
    text = resources.files("hf_specdec.bench").joinpath(RECORD_FILE).read_text()
    data = json.loads(text)
    return data["setting"], [StepRecord.from_json(m) for m in data["methods"]]


def _add(a: list[int], b: list[int]) -> list[int]:
    width = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(width)]
