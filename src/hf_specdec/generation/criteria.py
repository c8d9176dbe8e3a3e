"""A user's stopping criteria called as plain `generate()` calls them, whatever each row commits per step.

Plain decoding calls `stopping_criteria(input_ids, scores)` once per position, on the whole batch: `input_ids`
`(batch, length)` with every row's tokens (the pad token after a row that has finished, when an EOS id is known),
`scores` `(batch, vocab)` the processed scores that chose the position's tokens. A criterion may keep one setting
per row (stop row i on its own token, a per-row budget) or count its calls. Rows of a speculative step commit
several tokens each, and different numbers: `LockstepCriteria` keeps the scores of positions not yet checked, and
once every running row has reached a position, calls the criteria there on the whole batch, as plain decoding
would. A row a criterion stops is cut back to that position (the tokens it committed past it are dropped), so the
result, the calls and their order are plain decoding's wherever the tokens are the same. The scores of a row that
has finished are zeros (plain decoding passes what its model computes on the padding).
"""

from __future__ import annotations

import torch
from transformers import StoppingCriteriaList


class LockstepCriteria:
    """The stopping criteria of one call, checked position by position on the whole batch (see the module).

    Args:
        criteria (`StoppingCriteriaList`): the criteria to call (lengths and EOS ids are applied elsewhere).
        prompt (`int`): the prompts' padded length: positions after it are checked.
        batch (`int`): rows of the call.
        pad (`int` or `None`): the token shown after a row that has finished; `None` without an EOS id (plain
            decoding then keeps extending stopped rows, and shows their tokens).
    """

    def __init__(self, criteria: StoppingCriteriaList, prompt: int, batch: int, pad: int | None) -> None:
        self.criteria = criteria
        self.checked = prompt  # every position up to this one has been checked
        self.pad = pad
        self.lengths = [prompt] * batch  # each row's committed length, as known on the host
        self.ended: list[int | None] = [None] * batch  # where a row ended (EOS, length limit, a criterion)
        self.stopped_at: list[int | None] = [None] * batch  # without an EOS id: where a criterion first stopped it
        self._scores: dict[int, torch.Tensor] = {}  # position -> (batch, vocab) scores that chose its tokens

    def committed(
        self, rows: list[int], old: list[int], new: list[int], ended: list[bool], scores: torch.Tensor | None
    ) -> None:
        """Take a step's commits: active row `rows[i]` went from length `old[i]` to `new[i]` (`ended[i]`: it
        stopped there), its tokens chosen by `scores[i, j]` `(active, m, vocab)`."""
        for i, row in enumerate(rows):
            self.lengths[row] = new[i]
            if ended[i] and self.ended[row] is None:
                self.ended[row] = new[i]
            if scores is None:
                continue
            for j in range(new[i] - old[i]):
                position = old[i] + j + 1
                if position not in self._scores:
                    self._scores[position] = scores.new_zeros(len(self.lengths), scores.shape[-1])
                self._scores[position][row] = scores[i, j]

    def check(self, tokens: torch.Tensor, running: list[int], flush: bool = False) -> dict[int, int]:
        """Call the criteria at every position all `running` rows (original indices) have reached (every
        remaining one with `flush`); returns the rows to cut back, with their new lengths."""
        cuts: dict[int, int] = {}
        while True:
            position = self.checked + 1
            if not flush and any(self.lengths[row] < position for row in running):
                break  # a running row has not reached it: wait
            if all(end is not None and end < position for end in self.ended):
                break  # every row ended before it: plain decoding has stopped calling
            self._call(tokens, position, cuts)
            self.checked = position
        return cuts

    def _call(self, tokens: torch.Tensor, position: int, cuts: dict[int, int]) -> None:
        """The criteria at `position` on the whole batch; rows they stop are cut there (or, without an EOS id,
        noted, and all cut at the last such position once every row has stopped)."""
        view = tokens[:, :position].clone()  # (B, position)
        lengths = torch.tensor(self.lengths, device=view.device)
        if self.pad is not None:
            view.masked_fill_(torch.arange(position, device=view.device)[None, :] >= lengths[:, None], self.pad)
        scores = self._scores.pop(position, None)
        if scores is None:
            scores = torch.zeros(len(self.lengths), 1, device=view.device)
        hits = self.criteria(view, scores).tolist()
        for row, hit in enumerate(hits):
            if not hit:
                continue
            if self.pad is None:  # stop together: note the first stop, cut when every row has stopped
                if self.stopped_at[row] is None:
                    self.stopped_at[row] = position
                continue
            if self.ended[row] is None or self.ended[row] > position:
                self.ended[row] = position
                if self.lengths[row] > position:
                    self.lengths[row] = cuts[row] = position
        if self.pad is None and all(stop is not None for stop in self.stopped_at):
            last = max(stop for stop in self.stopped_at if stop is not None)
            for row, length in enumerate(self.lengths):
                self.ended[row] = min(length, last)
                if length > last:
                    self.lengths[row] = cuts[row] = last
