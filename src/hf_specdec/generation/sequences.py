"""The token side of a ragged batch: every row's tokens, its length, and when it stops.

Rows commit different numbers of tokens per step. Each row's tokens are kept left-aligned in one buffer,
exactly as plain `generate()` would have them (prompt with its left padding, then generated tokens), so
logits processors and stopping criteria see the same prefixes they would see in plain decoding.

When a row stops follows plain `generate()`: with an EOS id (an EOS stopping criterion), a row that stops, by
EOS or by any stopping criterion, is padded from there on. Without one, plain decoding keeps extending every
row until all of them have stopped (a stopped row is not padded), so all rows end at the same length: the
length at which the last row stopped.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from transformers import GenerationConfig, StoppingCriteriaList
from transformers.generation.stopping_criteria import (
    EosTokenCriteria,
    MaxLengthCriteria,
    MaxTimeCriteria,
    StopStringCriteria,
)

from hf_specdec.generation.criteria import LockstepCriteria

# Stopping criteria that are pure functions of the prefix (or of the clock) and take any prefix: they may be
# called on drafted tokens past where a row stops, whose answers are never read, so that the host reads nothing.
_ANY_PREFIX = (StopStringCriteria, MaxTimeCriteria)


class TokenBuffer:
    """Tokens of every row of the batch, with per-row lengths and the set of rows still running.

    Args:
        input_ids (`torch.LongTensor` of shape `(batch, prompt)`): left-padded prompts.
        generation_config (`GenerationConfig`): as prepared by `generate()` (its `max_length` is final).
        stopping_criteria (`StoppingCriteriaList`): `generate()`'s criteria. Length and EOS criteria are
            applied here exactly and in a vectorised way (the shortest length, every EOS id); the others
            are called on each row's exact prefix.
        scratch (`int`): room after `max_length` for the drafted tokens of a step.
    """

    def __init__(
        self,
        input_ids: torch.Tensor,
        generation_config: GenerationConfig,
        stopping_criteria: StoppingCriteriaList,
        scratch: int,
    ) -> None:
        batch, prompt = input_ids.shape
        lengths = [c.max_length for c in stopping_criteria if isinstance(c, MaxLengthCriteria)]
        max_length = min([generation_config.max_length, *lengths])
        eos = [c.eos_token_id.reshape(-1) for c in stopping_criteria if isinstance(c, EosTokenCriteria)]
        if generation_config._eos_token_tensor is not None:
            eos.append(generation_config._eos_token_tensor.reshape(-1))
        eos_token_ids = torch.cat(eos).to(input_ids.device).unique() if eos else None
        self.prompt_length = prompt
        self.max_length = max_length  # lowered when every row has stopped without an EOS id (see the docstring)
        self.tokens = input_ids.new_zeros(batch, max_length + scratch)  # (B, max_length + scratch)
        self.tokens[:, :prompt] = input_ids
        self.lengths = torch.full((batch,), prompt, dtype=torch.long, device=input_ids.device)  # (B,)
        self.active = torch.arange(batch, device=input_ids.device)  # rows still running, original indices
        self._active_lengths: torch.Tensor | None = None
        # The same on the host, kept in step by `settle` from each step's one read (see `readback`).
        self.host_lengths = [prompt] * batch
        self.active_rows = list(range(batch))
        self.host_tokens: list[list[int]] = input_ids.tolist()  # committed tokens only
        self.eos = eos_token_ids
        criteria = [c for c in stopping_criteria if not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))]
        # Plain `generate()` pads stopped rows only when some criterion knows an EOS id.
        self.pads_stopped_rows = any(hasattr(c, "eos_token_id") for c in stopping_criteria)
        pad = getattr(generation_config, "_pad_token_tensor", None)  # set by `generate()`
        self.pad_token_id = int(pad) if pad is not None else 0
        # Criteria that are pure functions of a row's prefix are called on each row's own; any other (a user's,
        # which may keep per-row settings or count its calls) as plain decoding calls it (`LockstepCriteria`).
        self.lockstep: LockstepCriteria | None = None
        if any(type(c) not in _ANY_PREFIX for c in criteria):
            shown = self.pad_token_id if self.pads_stopped_rows else None
            keep = bool(generation_config.output_scores and generation_config.return_dict_in_generate)
            self.lockstep = LockstepCriteria(StoppingCriteriaList(criteria), prompt, batch, shown, keep)
            criteria = []
        self.criteria = StoppingCriteriaList(criteria)
        self._criteria_any_prefix = all(type(c) in _ANY_PREFIX for c in self.criteria)
        # Without padding: the length at which each row first stopped (max_length while it has not).
        self.stopped_at = torch.full((batch,), max_length, dtype=torch.long, device=input_ids.device)
        self.stopped = torch.zeros(batch, dtype=torch.bool, device=input_ids.device)

    @property
    def active_lengths(self) -> torch.Tensor:
        """The active rows' lengths `(active,)` (kept until a commit or a retirement changes them)."""
        if self._active_lengths is None:
            self._active_lengths = self.lengths[self.active]
        return self._active_lengths

    @property
    def lagging(self) -> torch.Tensor:
        """`lagging_rows` on the device `(active,)` (copied, never read back)."""
        return torch.tensor(self.lagging_rows()).to(self.tokens.device, non_blocking=True)

    def write(self, offset: int, new_tokens: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        """Write `(active, m)` tokens at each active row's length + `offset`, without committing them
        (`rows`: positions in the active order of the `(len(rows), m)` tokens' rows; default all)."""
        active = self.active if rows is None else self.active[rows]
        lengths = self.active_lengths if rows is None else self.lengths[active]
        columns = lengths[:, None] + (offset + torch.arange(new_tokens.shape[1], device=self.tokens.device))
        self.tokens[active[:, None], columns] = new_tokens

    def prefixes(self, length: int, shown: torch.Tensor) -> torch.Tensor:
        """Every row's first `length` tokens `(batch, length)` as a logits processor is to see them when it
        scores rows `shown` (original indices): those rows with their uncommitted (drafted) tokens, every other
        row with its committed tokens only, then padding (as plain `generate()` shows a finished row)."""
        view = self.tokens[:, :length].clone()
        hidden = torch.arange(length, device=view.device)[None, :] >= self.lengths[:, None]  # (B, length)
        hidden[shown] = False
        return view.masked_fill_(hidden, self.pad_token_id)

    def commit(
        self, new_tokens: torch.Tensor, counts: torch.Tensor, scores: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append to every active row its first `counts[b]` new tokens, stopping where plain decoding would.

        Args:
            new_tokens (`torch.LongTensor` of shape `(active, m)`): candidate tokens to append, in order.
            counts (`torch.LongTensor` of shape `(active,)`): how many of them each row accepted, `>= 1`.
            scores (`torch.Tensor` of shape `(active, m, vocab)`, *optional*): the processed target scores
                that chose each token, passed to custom stopping criteria as plain `generate()` does.

        Returns:
            `(emitted, finished)`: `emitted` `(active,)` tokens actually appended; `finished` `(active,)` rows
            that stopped (EOS, length limit or a stopping criterion).
        """
        m = new_tokens.shape[1]
        lengths = self.active_lengths
        self.write(0, new_tokens)
        offsets = torch.arange(m, device=new_tokens.device)[None, :]  # (1, m)
        counts = torch.minimum(counts, self.max_length - lengths)
        finished = lengths + counts >= self.max_length
        if self.eos is not None:
            is_eos = torch.isin(new_tokens, self.eos) & (offsets < counts[:, None])  # (A, m)
            first_eos = torch.where(is_eos, offsets, m).min(dim=1).values  # (A,)
            hit = first_eos < m
            counts = torch.where(hit, first_eos + 1, counts)
            finished |= hit
        if self.criteria and self.pads_stopped_rows:  # every row: a criterion may stop it before its EOS or limit
            counts, stopped = self._apply_criteria(lengths, counts, scores, torch.ones_like(finished))
            finished |= stopped
        if self.lockstep is not None:
            return self._commit_lockstep(lengths, counts, finished, scores)
        self.lengths[self.active] = lengths + counts
        self._active_lengths = None
        if self.criteria and not self.pads_stopped_rows:
            counts, finished = self._stop_together(lengths, counts, scores)
        return counts, finished

    @property
    def needs_scores(self) -> bool:
        """Whether stopping criteria read the scores that chose each token."""
        return bool(self.criteria) or (self.lockstep is not None and self.lockstep.keep_scores)

    def _commit_lockstep(
        self, lengths: torch.Tensor, counts: torch.Tensor, finished: torch.Tensor, scores: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`commit` with criteria called as plain decoding calls them (`LockstepCriteria`): the new lengths are read,
        the criteria called at every position all running rows have reached, and rows they stop cut back (rows
        that left the batch included)."""
        assert self.lockstep is not None
        rows, old = self.active_rows, self.active_host_lengths
        new_lengths = lengths + counts
        new, ended = new_lengths.tolist(), finished.tolist()
        self.lengths[self.active] = new_lengths
        self._active_lengths = None
        self.lockstep.committed(rows, old, new, ended, scores)
        running = [row for row, done in zip(rows, ended, strict=True) if not done]
        for row, length in self.lockstep.check(self.tokens, running).items():
            self.lengths[row] = length
            # The host's copy, cut back where it holds more (a row that left the batch, or an active row cut before
            # this step's tokens: `settle` appends the step's emitted tokens, none for it).
            self.host_lengths[row] = min(self.host_lengths[row], length)
            self.host_tokens[row] = self.host_tokens[row][:length]
        emitted = (self.lengths[self.active] - lengths).clamp_min(0)
        done = [self.lockstep.ended[row] is not None for row in rows]
        return emitted, torch.tensor(done, device=lengths.device)

    @property
    def confirmed(self) -> int:
        """The length up to which every row's tokens are final, from the host's lengths (without `lockstep`, which
        puts positions on the streamer itself as it checks them)."""
        if self.active_rows:
            return min(self.host_lengths[row] for row in self.active_rows)
        return max(self.host_lengths)

    def _stop_together(
        self, lengths: torch.Tensor, counts: torch.Tensor, scores: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Without an EOS id: note where rows first stop (they keep going), and once every row has stopped,
        end all of them at the last of those lengths, cutting back rows that went past it."""
        running = ~self.stopped[self.active]
        stop_counts, stopped = self._apply_criteria(lengths, counts, scores, running)
        rows = self.active[stopped]
        self.stopped_at[rows] = lengths[stopped] + stop_counts[stopped]
        self.stopped[rows] = True
        if bool(self.stopped.all()):
            self.max_length = min(self.max_length, int(self.stopped_at.max()))
            self.lengths.clamp_(max=self.max_length)
        new_lengths = self.lengths[self.active]
        return (new_lengths - lengths).clamp_min(0), new_lengths >= self.max_length

    def _apply_criteria(
        self, lengths: torch.Tensor, counts: torch.Tensor, scores: torch.Tensor | None, running: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Call the stopping criteria after each new token of the `running` rows, in order; returns the counts
        cut after the first token that stops a row, and which rows stopped."""
        if self._criteria_any_prefix and scores is not None:
            return self._apply_criteria_everywhere(counts, scores, running)
        counts = counts.clone()
        stopped = torch.zeros_like(counts, dtype=torch.bool)
        for j in range(int(counts.max())):
            rows = ((counts > j) & ~stopped & running).nonzero(as_tuple=True)[0]
            for length in torch.unique(lengths[rows] + j + 1).tolist():
                group = rows[lengths[rows] + j + 1 == length]
                step_scores = scores[group, j] if scores is not None else None
                hit = self.criteria(self.tokens[self.active[group], :length], step_scores)
                hit = hit.to(group.device)
                counts[group[hit]] = j + 1
                stopped[group[hit]] = True
        return counts, stopped

    def _apply_criteria_everywhere(
        self, counts: torch.Tensor, scores: torch.Tensor, running: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`_apply_criteria` for criteria that take any prefix: called after every new token of every row, grouped
        by prefix lengths the host knows; the answers past a row's count are dropped. Reads nothing."""
        active, m = self.active, scores.shape[1]
        hits = torch.zeros(counts.shape[0], m, dtype=torch.bool, device=counts.device)  # (A, m)
        host = self.active_host_lengths
        first = min(host)
        for offset, rows, positions in length_groups(tuple(length - first for length in host), m):
            b = torch.tensor(rows).to(counts.device, non_blocking=True)
            j = torch.tensor(positions).to(counts.device, non_blocking=True)
            hit = self.criteria(self.tokens[active[b], : first + offset + 1], scores[b, j])
            hits[b, j] = hit.to(counts.device)
        offsets = torch.arange(m, device=counts.device)[None, :]
        hits &= (offsets < counts[:, None]) & running[:, None]
        first_hit = torch.where(hits, offsets, m).min(dim=1).values  # (A,)
        stopped = first_hit < m
        return torch.where(stopped, first_hit + 1, counts), stopped

    @property
    def active_host_lengths(self) -> list[int]:
        """The active rows' lengths as the host knows them (`active_lengths` without reading the device)."""
        return [self.host_lengths[row] for row in self.active_rows]

    @property
    def least_advanced(self) -> int:
        """The shortest active row's length, from the host's lengths."""
        return min(self.host_lengths[row] for row in self.active_rows)

    def laggard(self) -> int:
        """Position (in the active order) of the least advanced row, from the host's lengths."""
        lengths = [self.host_lengths[row] for row in self.active_rows]
        return lengths.index(min(lengths))

    def lagging_rows(self) -> list[bool]:
        """Which active rows are the least advanced, from the host's lengths: a batched call ends with its last
        row, so what drafts are worth is what they bring these rows (rows ahead finishing sooner barely shortens
        the call). The one definition of the rows whose gains the adaptive decisions weigh."""
        least = self.least_advanced
        return [self.host_lengths[row] == least for row in self.active_rows]

    def settle(self, tokens: list[list[int]]) -> None:
        """Bring the host's tokens and lengths in step with a commit: active row i committed `tokens[i]` (rows
        are cut back to `max_length`, which a commit may have lowered for every row)."""
        for row, committed in zip(self.active_rows, tokens, strict=True):
            self.host_tokens[row] += committed
            self.host_lengths[row] += len(committed)
        if any(length > self.max_length for length in self.host_lengths):
            self.host_lengths = [min(length, self.max_length) for length in self.host_lengths]
            self.host_tokens = [row[: self.max_length] for row in self.host_tokens]

    def retire(self, finished: list[bool]) -> torch.Tensor | None:
        """Drop finished rows from the active set; returns the positions (in the old active order) kept, or
        `None` when every row is still running."""
        if not any(finished):
            return None
        keep = [i for i, done in enumerate(finished) if not done]
        self.active_rows = [self.active_rows[i] for i in keep]
        index = torch.tensor(keep, dtype=torch.long).to(self.active.device, non_blocking=True)
        self.active = self.active[index]
        self._active_lengths = None
        return index

    def sequences(self, pad_token_id: int) -> torch.Tensor:
        """The output of `generate()`: `(batch, prompt + longest generation)`, padded after each row's end."""
        width = int(self.lengths.max())
        out = self.tokens[:, :width].clone()
        columns = torch.arange(width, device=out.device)[None, :]
        out[columns >= self.lengths[:, None]] = pad_token_id
        return out


@lru_cache(maxsize=256)
def length_groups(offsets: tuple[int, ...], n: int) -> list[tuple[int, list[int], list[int]]]:
    """The pairs (row b, position j) of `n` positions after rows whose prefixes start `offsets` after the
    shortest, grouped by prefix length: `(length - shortest, rows, positions)`, shortest first."""
    groups: dict[int, tuple[list[int], list[int]]] = {}
    for b, offset in enumerate(offsets):
        for j in range(n):
            rows, positions = groups.setdefault(offset + j, ([], []))
            rows.append(b)
            positions.append(j)
    return [(length, *groups[length]) for length in sorted(groups)]
