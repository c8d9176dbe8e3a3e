"""Prompt lookup where it pays, the draft model elsewhere: `generate(assistant=draft, prompt_lookup_num_tokens=k)`.

A lookup costs nothing to draft but is only as good as the repetition in the text; a draft model is right
more often but every drafted token costs one of its forwards. Code edits and answers that quote their
prompt repeat long spans, where a lookup step commits many tokens for one target forward; free chat
rarely does, where the draft model is the better bet. Each step, this drafter compares the two:

    lookup:  expected tokens per row  1 + sum_j P(lookup drafts 1..j accepted)   (measured by position and
                                                                               matched n-gram size)
             cost                     1 + v * rows * k_lookup                  (in one-token target forwards)
    model:   expected tokens per row  1 + mean accepted drafts in recent model steps
             cost                     1 + (c + v * rows) * mean drafts in recent model steps

and drafts with the one whose expected tokens per unit of cost is higher (`decisions.lookup_pays_more`; `c`: a
draft forward's cost, `v`: one more verified token per row, both from the loop's `CostModel`). Before the first
model step the model drafts. On model steps the lookup's proposal is compared with the committed tokens,
so its acceptance keeps being measured while it is not used. Where the draft model's steps do not pay (the
speculation gate keeps steps plain: large batches, a draft model that rarely agrees), the lookup still proposes
when it has drafts worth verifying (`propose_free`). After a lookup step the draft model catches up on the
committed tokens in one forward at its next proposal. Either way the target verifies, so outputs stay
exactly the target's.
"""

from __future__ import annotations

import torch

from hf_specdec.drafters.draft_model import DraftModelDrafter
from hf_specdec.drafters.lookup import PromptLookupDrafter
from hf_specdec.generation.decisions import CostModel, lookup_pays_more
from hf_specdec.generation.decisions.constants import MODEL_STEP_SMOOTHING
from hf_specdec.generation.drafter import Accepted, Chain, ChainDrafter, Proposal
from hf_specdec.generation.readback import StepOutcome
from hf_specdec.generation.sequences import TokenBuffer


class HybridDrafter(ChainDrafter):
    """Drafts each step by prompt lookup or with the draft model, whichever is expected to commit more tokens
    per unit of cost.

    Args:
        model (`DraftModelDrafter`): the draft model's drafter.
        lookup (`PromptLookupDrafter`): the prompt lookup drafter (it measures its own acceptance).
    """

    def __init__(self, model: DraftModelDrafter, lookup: PromptLookupDrafter) -> None:
        self.model = model
        self.lookup = lookup
        self.max_depth = max(model.max_depth, lookup.max_depth)
        self.model_tokens: float | None = None  # mean committed tokens per row in recent model steps
        self.model_drafts: float | None = None  # mean drafted tokens (draft forwards) in recent model steps
        self.last: Chain | None = None

    def prefill(self, input_ids: torch.Tensor, valid: torch.Tensor, positions: torch.Tensor) -> None:
        self.model.prefill(input_ids, valid, positions)
        self.lookup.prefill(input_ids, valid, positions)

    def start(self, first_token: torch.Tensor, hidden: torch.Tensor | None = None) -> None:
        self.model.start(first_token)

    def draft_chain(self, buffer: TokenBuffer, next_position: torch.Tensor, costs: CostModel, max_tokens: int) -> Chain:
        """A lookup proposal when it is expected to pay more per unit of cost than a model step, else the
        draft model's (`costs`: the loop's); the lookup's alone once the draft model has no positions left to
        draft at, or while starting it does not pay (`DraftModelDrafter.room`)."""
        looked_up = self.lookup.draft_chain(buffer, next_position, costs, max_tokens)
        rows = len(buffer.active_rows)
        if self._lookup_pays(looked_up, rows, costs) or self.model.room(next_position, costs, max_tokens) < 1:
            # Nothing looked up while the draft model is not worth starting: a plain step.
            self.last = looked_up._replace(
                plain=looked_up.tokens.shape[1] == 0 and self.model.declined, started=self.model.take_started()
            )
        else:
            self.last = self.model.draft_chain(buffer, next_position, costs, max_tokens)
        return self.last

    def propose_free(
        self,
        buffer: TokenBuffer,
        last_token: torch.Tensor,
        next_position: torch.Tensor,
        costs: CostModel,
        max_tokens: int,
    ) -> Proposal | None:
        """The lookup's proposal alone, for a step the speculation gate keeps plain (the draft model's steps do not
        pay there, a lookup's costs no draft forward): `None` where it drafts nothing (its own rule weighs each
        draft against what verifying it costs, `shared_width`)."""
        looked_up = self.lookup.draft_chain(buffer, next_position, costs, max_tokens)
        if looked_up.tokens.shape[1] == 0:
            return None
        self.last = looked_up
        return self.proposal_of(last_token, looked_up)

    def _lookup_pays(self, looked_up: Chain, rows: int, costs: CostModel) -> bool:
        k = looked_up.tokens.shape[1]
        if k == 0 or self.model_tokens is None or self.model_drafts is None:
            return False
        expected = self.lookup.expected_tokens()
        return lookup_pays_more(costs, rows, expected, k, self.model_tokens, self.model_drafts)

    def commit_chain(
        self,
        num_accepted: torch.Tensor,
        num_drafted: int,
        next_token: torch.Tensor,
        outcome: StepOutcome | None = None,
    ) -> None:
        assert self.last is not None
        committed = torch.cat([self.last.tokens, next_token[:, None]], dim=1)  # (A, k+1)
        committed.scatter_(1, num_accepted[:, None], next_token[:, None])  # accepted drafts, then the target's
        host = outcome.num_accepted if outcome is not None else num_accepted.tolist()
        if not self.last.looked_up:
            self.model.commit_chain(num_accepted, num_drafted, next_token, outcome)
            # What the lookup would have drafted is known too: learn from it, so lookup can win again.
            if outcome is not None:
                self.lookup.observe(outcome.tokens)
            else:
                self.lookup.observe([row[: n + 1] for row, n in zip(committed.tolist(), host, strict=True)])
            tokens, drafts = 1.0 + sum(host) / max(len(host), 1), float(num_drafted)
            if self.model_tokens is None or self.model_drafts is None:
                self.model_tokens, self.model_drafts = tokens, drafts
            else:
                self.model_tokens += MODEL_STEP_SMOOTHING * (tokens - self.model_tokens)
                self.model_drafts += MODEL_STEP_SMOOTHING * (drafts - self.model_drafts)
            return
        self.lookup.commit_chain(num_accepted, num_drafted, next_token, outcome)
        self.model.catch_up(committed, num_accepted + 1, None if outcome is None else max(host) + 1)

    def follow(self, accepted: Accepted) -> None:
        self.model.follow(accepted)

    def select_rows(self, keep: torch.Tensor) -> None:
        self.model.select_rows(keep)
        self.lookup.select_rows(keep)
