"""What the host learns of a decoding step, read from the device at once.

On a GPU every read of a device value by the host (`.item()`, `.tolist()`, `int(t)`, a boolean mask) waits for
every kernel queued before it, so a step that reads often leaves the device idle between its reads. The loop
reads once per step: right after it commits, one small integer tensor holds what the host needs to steer the
next step (how many tokens each row accepted and committed, which rows finished, the committed tokens
themselves); the loop's bookkeeping and the drafters' own decisions follow from those values
(`StepOutcome`). Values the host needs but can wait a step for (how many holes a KV cache has, for a
compaction) are queued with [`HostReads.later`] and travel with the next read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StepOutcome:
    """One step's outcome per active row, as host values.

    Attributes:
        num_accepted (`list[int]`): drafted tokens accepted.
        emitted (`list[int]`): tokens committed (fewer than `num_accepted + 1` where an EOS, a stopping
            criterion or the length limit cut the row).
        finished (`list[bool]`): rows that stopped.
        drafted (`list[int]`): tokens drafted (a tree's depth), for the statistics.
        tokens (`list[list[int]]`): the committed tokens, `emitted[i]` of them per row.
    """

    num_accepted: list[int]
    emitted: list[int]
    finished: list[bool]
    drafted: list[int]
    tokens: list[list[int]]

    @property
    def max_accepted(self) -> int:
        return max(self.num_accepted, default=0)


class HostReads:
    """Reads device values for the host, as few times as possible: the loop's one read per step carries
    every value queued since the last one."""

    def __init__(self) -> None:
        self._queued: list[tuple[torch.Tensor, Callable[[list[int]], None]]] = []

    def later(self, values: torch.Tensor, then: Callable[[list[int]], None]) -> None:
        """Read integer `values` (any shape) with the next [`read`], and hand them to `then` as a flat list."""
        self._queued.append((_flat_long(values), then))

    def read(self, *values: torch.Tensor) -> list[list[int]]:
        """Read integer `values` now, with everything queued by [`later`], in one device-to-host copy; returns
        each of `values` as a flat list."""
        queued, self._queued = self._queued, []
        parts = [_flat_long(v) for v in values] + [v for v, _ in queued]
        if not parts:
            return []
        device = parts[0].device
        flat: list[int] = torch.cat([p if p.device == device else p.to(device) for p in parts]).tolist()
        pieces, start = [], 0
        for part in parts:
            pieces.append(flat[start : start + part.numel()])
            start += part.numel()
        for (_, then), piece in zip(queued, pieces[len(values) :], strict=True):
            then(piece)
        return pieces[: len(values)]

    def step_outcome(
        self,
        num_accepted: torch.Tensor,
        emitted: torch.Tensor,
        finished: torch.Tensor,
        drafted: torch.Tensor | int,
        tokens: torch.Tensor,
    ) -> StepOutcome:
        """Read a step's outcome (see `StepOutcome`): `tokens` `(active, m)` holds each row's committed tokens
        first; `drafted` is per row `(active,)`, or one count for every row."""
        rows = num_accepted.shape[0]
        per_row = isinstance(drafted, torch.Tensor)
        values = (num_accepted, emitted, finished, tokens) + ((drafted,) if per_row else ())
        read = self.read(*values)
        accepted, counts, stopped, flat = read[0], read[1], read[2], read[3]
        width = tokens.shape[1] if tokens.dim() == 2 else 0
        committed = [flat[i * width : i * width + counts[i]] for i in range(rows)]
        drafted_rows = read[4] if per_row else [int(drafted)] * rows
        return StepOutcome(accepted, counts, [bool(s) for s in stopped], drafted_rows, committed)


def _flat_long(values: torch.Tensor) -> torch.Tensor:
    """`values` as a flat integer tensor (as few operations as can be: this runs at every step)."""
    flat = values if values.dim() == 1 else values.reshape(-1)
    return flat if flat.dtype == torch.long else flat.long()
