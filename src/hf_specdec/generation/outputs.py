"""What speculative `generate()` returns: transformers' output class plus per-row speculative statistics."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

from hf_specdec.generation.decisions import SpeculativeCosts


@dataclass
class SpeculativeStats:
    """Counters of one speculative `generate()` call.

    Per row (tensors of shape `(batch,)`):
        target_forwards: verification forwards of the target while the row was running (the prefill not counted).
        drafted_tokens: tokens drafted for the row (for a tree, its depth: the most a step can accept).
        accepted_tokens: drafted tokens the target accepted.
        emitted_tokens: tokens the verification steps committed (accepted drafts plus the target's own token,
            less what an EOS or the length limit cut off).
    Whole batch (tensors of shape `(max_draft_length,)`):
        drafted_at_position / accepted_at_position: how often the j-th drafted token of a step was proposed
            and accepted, summed over rows and steps; their ratio is the acceptance rate by draft position.
        draft_seconds / verify_seconds: time spent drafting and verifying.
        costs: the costs at the end of the call (measured while decoding, or those passed as
            `speculative_costs`); pass them back as `speculative_costs=` for reproducible sampling.
        lookup_steps: steps in which prompt lookup drafted for some row (with both a draft model and prompt
            lookup, the others were drafted by the model; with Medusa heads, steps in which some row's tree had
            a looked-up continuation grafted on).
        plain_steps: steps taken without drafts because drafting was not expected to pay for itself (the
            speculation gate, `hf_specdec.generation.decisions`).
        draft_forwards: forward passes of a draft model or of EAGLE heads' decoder layer (0 for prompt lookup and
            Medusa heads).
        verify_widths: `{tokens per row: steps}`, how wide each verification forward was (a tree's nodes plus
            its root); with `draft_forwards`, what a step costs on other hardware (`hf_specdec.bench.gpu`).
    """

    target_forwards: torch.Tensor
    drafted_tokens: torch.Tensor
    accepted_tokens: torch.Tensor
    emitted_tokens: torch.Tensor
    drafted_at_position: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    accepted_at_position: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    lookup_steps: int = 0
    plain_steps: int = 0
    draft_forwards: int = 0
    verify_widths: dict[int, int] = field(default_factory=dict)
    costs: SpeculativeCosts | None = None

    @classmethod
    def zeros(cls, batch_size: int) -> SpeculativeStats:
        z = torch.zeros(batch_size, dtype=torch.long)
        return cls(z.clone(), z.clone(), z.clone(), z.clone())

    @property
    def tau(self) -> torch.Tensor:
        """Mean tokens committed per target verification forward, per row `(batch,)`: accepted drafts plus the
        one token every verification adds (a correction or a bonus)."""
        return self.emitted_tokens.double() / self.target_forwards.clamp_min(1).double()

    @property
    def acceptance_rate(self) -> torch.Tensor:
        """Share of drafted tokens accepted, per row `(batch,)`."""
        return self.accepted_tokens.double() / self.drafted_tokens.clamp_min(1).double()

    def summary(self) -> dict[str, float]:
        """Batch totals as plain numbers, for logs and benchmarks."""
        forwards = int(self.target_forwards.sum())
        accepted = int(self.accepted_tokens.sum())
        drafted = int(self.drafted_tokens.sum())
        emitted = int(self.emitted_tokens.sum())
        return {
            "target_forwards": forwards,
            "drafted_tokens": drafted,
            "accepted_tokens": accepted,
            "tau": emitted / max(forwards, 1),
            "acceptance_rate": accepted / max(drafted, 1),
            "draft_seconds": self.draft_seconds,
            "verify_seconds": self.verify_seconds,
            "lookup_steps": self.lookup_steps,
            "plain_steps": self.plain_steps,
        }


class StepCounts:
    """The per-row and per-position counters of `SpeculativeStats`, kept as host numbers while decoding (counting
    costs neither the device nor tensor operations) and written into the statistics once at the end."""

    def __init__(self, batch_size: int) -> None:
        self.forwards = [0] * batch_size
        self.drafted = [0] * batch_size
        self.accepted = [0] * batch_size
        self.emitted = [0] * batch_size
        self.drafted_at: list[int] = []
        self.accepted_at: list[int] = []

    def record(self, rows: list[int], drafted: list[int], num_accepted: list[int], emitted: list[int]) -> None:
        """Count one verification step of the active `rows` (original batch indices): row `rows[i]` drafted
        `drafted[i]` tokens, accepted `num_accepted[i]` and committed `emitted[i]`."""
        for row, d, a, e in zip(rows, drafted, num_accepted, emitted, strict=True):
            self.forwards[row] += 1
            self.drafted[row] += d
            self.accepted[row] += a
            self.emitted[row] += e
            if d > len(self.drafted_at):
                grow = d - len(self.drafted_at)
                self.drafted_at += [0] * grow
                self.accepted_at += [0] * grow
            for j in range(d):
                self.drafted_at[j] += 1
            for j in range(min(a, d)):
                self.accepted_at[j] += 1

    def write(self, stats: SpeculativeStats) -> None:
        """Set `stats`' counters to these counts."""
        stats.target_forwards = torch.tensor(self.forwards, dtype=torch.long)
        stats.drafted_tokens = torch.tensor(self.drafted, dtype=torch.long)
        stats.accepted_tokens = torch.tensor(self.accepted, dtype=torch.long)
        stats.emitted_tokens = torch.tensor(self.emitted, dtype=torch.long)
        stats.drafted_at_position = torch.tensor(self.drafted_at, dtype=torch.long)
        stats.accepted_at_position = torch.tensor(self.accepted_at, dtype=torch.long)


@dataclass
class SpeculativeDecoderOnlyOutput(GenerateDecoderOnlyOutput):
    """[`~transformers.generation.GenerateDecoderOnlyOutput`] with the statistics of speculative decoding.

    Args:
        speculative (`SpeculativeStats`): per-row target forwards, drafted and accepted tokens, and tau.
    """

    speculative: SpeculativeStats | None = None


class ScoreRecorder:
    """Collects, per row, the target's scores for every committed token, for `output_scores` (processed)
    and `output_logits` (raw), and assembles them as `generate()` returns them: a tuple with one
    `(batch, vocab)` tensor per generated position. Positions after a row's last token hold zeros (plain
    decoding would have scored the padding there)."""

    def __init__(self, batch_size: int, scores: bool, logits: bool) -> None:
        self.keep_scores, self.keep_logits = scores, logits
        self._scores: list[list[torch.Tensor]] = [[] for _ in range(batch_size)]
        self._logits: list[list[torch.Tensor]] = [[] for _ in range(batch_size)]

    def record(self, rows: list[int], counts: list[int], scores: torch.Tensor, logits: torch.Tensor) -> None:
        """Row `rows[i]` committed `counts[i]` tokens, chosen from `scores[i, :counts[i]]` `(active, n, vocab)`."""
        for i, (row, count) in enumerate(zip(rows, counts, strict=True)):
            if self.keep_scores:
                self._scores[row].extend(scores[i, :count].unbind(0))
            if self.keep_logits:
                self._logits[row].extend(logits[i, :count].unbind(0))

    def trim(self, counts: torch.Tensor) -> None:
        """Keep row b's first `counts[b]` positions (rows cut back to where all rows stopped, see
        `TokenBuffer`)."""
        for row, count in enumerate(counts.tolist()):
            del self._scores[row][count:]
            del self._logits[row][count:]

    @staticmethod
    def _assemble(per_row: list[list[torch.Tensor]]) -> tuple[torch.Tensor, ...]:
        length = max(len(r) for r in per_row)
        reference = next(t for r in per_row for t in r)
        zeros = torch.zeros_like(reference)
        return tuple(torch.stack([r[t] if t < len(r) else zeros for r in per_row]) for t in range(length))

    def scores(self) -> tuple[torch.Tensor, ...] | None:
        return self._assemble(self._scores) if self.keep_scores else None

    def logits(self) -> tuple[torch.Tensor, ...] | None:
        return self._assemble(self._logits) if self.keep_logits else None
