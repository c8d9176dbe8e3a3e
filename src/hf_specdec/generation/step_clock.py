"""Timing decoding steps without making the device wait.

The loop's cost model learns from how long each step's drafting and verification took. On a CPU the wall
clock tells at once. On a GPU work is queued and a wall-clock reading would need `torch.cuda.synchronize()`
twice per step; instead the clock records CUDA events into the stream and reads them one step late, once the
step's single host read (see `readback`) has waited for them anyway.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import torch

_Shape = tuple[int, int, int, float, bool, bool, bool]  # StepTiming's fields after the two timings


class StepTiming(NamedTuple):
    """One step as the cost model sees it.

    Attributes:
        draft (`float`): seconds spent drafting.
        verify (`float`): seconds spent verifying and committing.
        forwards (`int`): draft forwards the step took.
        rows (`int`): rows verified.
        width (`int`): tokens verified per row.
        gained (`float`): tokens the least advanced row committed.
        catch_up (`bool`): the drafting began by feeding a draft what it had not seen (`Proposal.catch_up`).
        free (`bool`): its drafts cost no drafter forward and were taken while the speculation gate waited.
        started (`bool`): the drafter began by feeding its draft model the prompts (`Proposal.started`).
    """

    draft: float
    verify: float
    forwards: int
    rows: int
    width: int
    gained: float
    catch_up: bool = False
    free: bool = False
    started: bool = False


class StepClock:
    """Times each step's drafting and verification on `device`: wall-clock readings on a CPU, CUDA events read a
    step late on a GPU.

    Call `start()` before drafting, `drafted()` before verifying and `verified(...)` at the end of the step; the
    latter returns the timings that are known by then (this step's on a CPU, the previous one's on a GPU)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.draft_seconds = 0.0
        self.verify_seconds = 0.0
        self._marks: list[float | torch.cuda.Event] = []
        self._pending: tuple[list[torch.cuda.Event], _Shape] | None = None

    def _mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks.append(event)
        else:
            self._marks.append(time.perf_counter())

    def start(self) -> None:
        self._marks = []
        self._mark()

    def drafted(self) -> None:
        self._mark()

    def verified(
        self,
        forwards: int,
        rows: int,
        width: int,
        gained: float,
        catch_up: bool = False,
        free: bool = False,
        started: bool = False,
    ) -> list[StepTiming]:
        """End the step (`forwards` draft forwards, `rows` x `width` tokens verified, `gained` tokens for the
        least advanced row, `catch_up`, `free` and `started` as in `StepTiming`) and return the timings now known."""
        self._mark()
        shape = (forwards, rows, width, gained, catch_up, free, started)
        if not self.cuda:
            start, drafted, verified = self._marks  # type: ignore[misc]
            return [self._timing(float(drafted - start), float(verified - drafted), shape)]
        done, self._pending = self._pending, (list(self._marks), shape)  # type: ignore[arg-type]
        if done is None:
            return []
        (start, drafted, verified), shape = done
        return [self._timing(start.elapsed_time(drafted) / 1e3, drafted.elapsed_time(verified) / 1e3, shape)]

    def _timing(self, draft: float, verify: float, shape: _Shape) -> StepTiming:
        self.draft_seconds += draft
        self.verify_seconds += verify
        return StepTiming(draft, verify, *shape)
