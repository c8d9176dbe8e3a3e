"""A streamer fed as plain `generate()` feeds it, whatever each row commits per step.

Plain decoding puts one `(batch,)` tensor per position on the streamer: every row's token at that position, the pad
token for rows that have finished. A speculative step commits several tokens per row, and rows commit different
numbers: `PlainOrderStream` keeps each row's committed tokens until every row still running has reached a
position, then puts that position's tokens, so a streamer (a `TextStreamer`, a recording one, one that reads row
i as row i) sees the very calls plain decoding makes wherever the tokens are the same, at any batch size.
"""

from __future__ import annotations

from collections import deque

import torch
from transformers.generation.streamers import BaseStreamer

from hf_specdec.generation.readback import StepOutcome


class PlainOrderStream:
    """Puts committed tokens on `streamer` position by position, `(batch,)` at a time (see the module's docstring).

    Args:
        streamer (`BaseStreamer`): the caller's streamer.
        batch (`int`): rows of the call.
        pad (`int`): the token plain decoding puts for rows that have finished.
    """

    def __init__(self, streamer: BaseStreamer, batch: int, pad: int) -> None:
        self.streamer = streamer
        self.pad = pad
        self.waiting: list[deque[int]] = [deque() for _ in range(batch)]
        self.finished = [False] * batch

    def step(self, rows: list[int], outcome: StepOutcome) -> None:
        """Take a step's committed tokens (`outcome`, one entry per row of `rows`, the call's row indices) and put
        every position all running rows have reached."""
        for row, tokens, finished in zip(rows, outcome.tokens, outcome.finished, strict=True):
            self.waiting[row].extend(tokens)
            self.finished[row] = self.finished[row] or finished
        while any(self.waiting) and all(w or done for w, done in zip(self.waiting, self.finished, strict=True)):
            column = [w.popleft() if w else self.pad for w in self.waiting]
            self.streamer.put(torch.tensor(column, dtype=torch.long))

    def end(self) -> None:
        """Put what is left (rows cut by the length limit stop together), then end the streamer."""
        self.finished = [True] * len(self.finished)
        while any(self.waiting):
            self.streamer.put(torch.tensor([w.popleft() if w else self.pad for w in self.waiting], dtype=torch.long))
        self.streamer.end()
