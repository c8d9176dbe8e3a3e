"""A user's stopping criteria called as plain `generate()` calls them, whatever each row commits per step.

Plain decoding calls `stopping_criteria(input_ids, scores)` once per position, on the whole batch: `input_ids`
`(batch, length)` with every row's tokens (the pad token after a row that has finished, when an EOS id is known),
`scores` `None`, or, when it returns its scores (`output_scores` with `return_dict_in_generate`), the tuple of every
position's `(batch, vocab)` processed scores so far. A criterion may keep one setting per row (stop row i on its own
token, a per-row budget) or count its calls. Rows of a speculative step commit several tokens each, and different
numbers: `LockstepCriteria` keeps what it needs of positions not yet checked, and once every running row has reached
a position, calls the criteria there on the whole batch, as plain decoding would. A row a criterion stops is cut
back to that position (the tokens it committed past it are dropped), so the result, the calls and their order are
plain decoding's wherever the tokens are the same. (A finished row's scores are zeros, where plain decoding passes
what its model computes on the padding.)
"""

from __future__ import annotations

import torch
from transformers import StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer


class LockstepCriteria:
    """The stopping criteria of one call, checked position by position on the whole batch (see the module).

    Args:
        criteria (`StoppingCriteriaList`): the criteria to call (lengths and EOS ids are applied elsewhere).
        prompt (`int`): the prompts' padded length: positions after it are checked.
        batch (`int`): rows of the call.
        pad (`int` or `None`): the token shown after a row that has finished; `None` without an EOS id (plain
            decoding then keeps extending stopped rows, and shows their tokens).
        keep_scores (`bool`): plain decoding passes its scores so far, a tuple of one `(batch, vocab)` tensor per
            position, when it returns them (`output_scores` with `return_dict_in_generate`), else `None`.
    """

    def __init__(
        self, criteria: StoppingCriteriaList, prompt: int, batch: int, pad: int | None, keep_scores: bool
    ) -> None:
        self.criteria = criteria
        self.keep_scores = keep_scores
        # The caller's streamer, when it streams: plain decoding puts a position's tokens right after calling the
        # criteria there, so the position is put here, from the criteria's own `input_ids` (`streaming`).
        self.streamer: BaseStreamer | None = None
        self.checked = prompt  # every position up to this one has been checked
        self.first = prompt
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
            if scores is None or not self.keep_scores:
                continue
            for j in range(new[i] - old[i]):
                position = old[i] + j + 1
                if position not in self._scores:
                    self._scores[position] = scores.new_zeros(len(self.lengths), scores.shape[-1])
                self._scores[position][row] = scores[i, j]

    def check(self, tokens: torch.Tensor, running: list[int]) -> dict[int, int]:
        """Call the criteria at every position all `running` rows (original indices) have reached (every
        remaining one once no row runs); returns the rows to cut back, with their new lengths."""
        cuts: dict[int, int] = {}
        while True:
            position = self.checked + 1
            running = [row for row in running if self.ended[row] is None]  # a criterion may have ended some
            if any(self.lengths[row] < position for row in running):
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
        scores = None
        if self.keep_scores:  # every position's so far, as plain decoding's `scores` tuple
            vocab = next((s.shape[-1] for s in self._scores.values()), 1)
            zeros = torch.zeros(len(self.lengths), vocab, device=view.device)
            scores = tuple(self._scores.get(p, zeros) for p in range(self.first + 1, position + 1))
        hits = self.criteria(view, scores).tolist()
        if self.streamer is not None:
            self.streamer.put(view[:, -1].cpu())
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
