"""A draft model whose tokenizer differs from the target's: it drafts in its own vocabulary, and its drafts reach
the target as target tokens (`generate(assistant=draft, tokenizer=..., assistant_tokenizer=...)`).

The draft reads each row's committed text in its own tokenization (`hf_specdec.drafters.text_alignment`: a
window after an anchor re-encoded at every step, its cache rolled back to the longest prefix it shares with that
encoding) and drafts a chain per row, at any batch size (rows hold different numbers of draft tokens: their cache
slots are masked per row and their positions counted per row, as for the same-vocabulary draft).

- Greedy: the draft's argmax tokens (of its raw logits) are decoded to text and the text encoded by the target's
  tokenizer after the target's last tokens; those target tokens are the proposal
  (`text_alignment.target_proposal`).
- Sampling: the draft proposes only tokens both vocabularies spell the same (`shared_vocab`): its logits on them,
  placed at their target ids and processed by the call's logits processors as the target's are, give a
  distribution q over target ids (the draft's distribution restricted to the shared tokens, renormalised: the
  "lossless" rule of Timor et al. 2025, transformers' universal speculative decoding). Each proposal is drawn
  from q and accepted with probability min(1, p/q), a rejection resampled from normalise(max(0, p - q)).

What is guaranteed, whatever the draft, its tokenizer and how the two tokenizations line up:

- greedy: the output is token-identical to plain greedy `generate()` (the target verifies every proposed token
  in its own vocabulary and adds its own argmax), exactly so in float32; in bf16 a forward over several tokens
  rounds differently from forwards over one, as for every speculative path;
- sampling: every token is distributed exactly as plain sampling from the target's processed distribution
  would give it, given the same prefix (Leviathan et al. 2022), so the outputs follow plain sampling's
  distribution; they are not the same draws for a given seed.

How often drafts are accepted, and so the speed, depends on the draft, on how much the vocabularies share
(sampling) and on how well the re-encoded text lines up with the target's own tokens (greedy).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from hf_specdec.drafters.draft_length import DraftLengthPolicy
from hf_specdec.drafters.draft_model import sample_draft
from hf_specdec.drafters.shared_vocab import SharedVocabulary, shared_vocabulary
from hf_specdec.drafters.text_alignment import CONTEXT, RowAlignment, Tokenizers, target_proposal
from hf_specdec.generation.decisions import CostModel
from hf_specdec.generation.drafter import Chain, ChainDrafter, DraftingContext
from hf_specdec.generation.kv_cache import CachedSequence
from hf_specdec.generation.positions import position_table_limit
from hf_specdec.generation.readback import StepOutcome
from hf_specdec.generation.recurrent import has_recurrent_layers
from hf_specdec.generation.sequences import TokenBuffer
from hf_specdec.generation.validation import output_vocab_size
from hf_specdec.trees.masks import chain_structure


class TranslatedDrafter(ChainDrafter):
    """Proposes a chain of target tokens per row with a draft model of another tokenizer (see the module).

    Args:
        model (`PreTrainedModel`): the draft model.
        tokenizers (`Tokenizers`): the target's and the draft's tokenizers.
        context (`DraftingContext`): the call's processors, sampling settings and the target's vocabulary size.
        schedule (`DraftLengthPolicy`, *optional*): how many draft tokens a step drafts (adaptive by default).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizers: Tokenizers,
        context: DraftingContext,
        schedule: DraftLengthPolicy | None = None,
    ) -> None:
        if has_recurrent_layers(model):  # it would go back to an earlier token whenever the text re-tokenizes
            raise ValueError(
                f"{type(model).__name__} keeps recurrent states, which cannot go back to an earlier token of the text "
                "once a step is decided: it cannot draft through another tokenizer. Draft with a model of the "
                "target's tokenizer, or with prompt lookup."
            )
        self.model = model
        self.tokenizers = tokenizers
        self.vocab_size = context.vocab_size
        self.processors = context.processors
        self.do_sample = context.do_sample
        self.generator = context.generator
        self.schedule = DraftLengthPolicy() if schedule is None else schedule
        # Re-encoded text can take more target tokens than the draft took: room for twice as many.
        self.max_depth = 2 * self.schedule.max_tokens
        self.device = model.device
        self.num_embeddings = int(model.get_input_embeddings().weight.shape[0])
        self.draft_tokens = len(tokenizers.draft)  # logits past it (a padded lm_head) are no token
        self.shared: SharedVocabulary | None = None
        if self.do_sample:
            built = shared_vocabulary(tokenizers.target, tokenizers.draft, self.vocab_size, output_vocab_size(model))
            if built.size == 0:
                raise ValueError(
                    "The target's and the draft's tokenizers share no token (none is spelled the same in both "
                    "vocabularies), and sampling with a draft of another tokenizer proposes only shared tokens. Pass "
                    "a draft whose tokenizer shares tokens with the target's, or decode greedily (do_sample=False), "
                    "which re-encodes the draft's text instead."
                )
            self.shared = built.to(self.device)
        draft_tokenizer = tokenizers.draft
        fallback = next((i for i in (draft_tokenizer.bos_token_id, draft_tokenizer.eos_token_id) if i is not None), 0)
        self.fallback_id = int(fallback)
        self.position_limit = position_table_limit(model)
        self.exhausted = False
        self.seq: CachedSequence | None = None
        self.rows: list[RowAlignment] = []  # per active row
        self.prompts: list[list[int]] = []  # per active row, the prompt's real target tokens
        self.prompt_length = 0

    def prefill(self, input_ids: torch.Tensor, valid: torch.Tensor, positions: torch.Tensor) -> None:
        """Encode each prompt's text with the draft's tokenizer and feed it to the draft."""
        self.prompt_length = input_ids.shape[1]
        self.prompts = [
            [token for token, real in zip(ids, mask, strict=True) if real]
            for ids, mask in zip(input_ids.tolist(), valid.tolist(), strict=True)
        ]
        self.rows = [RowAlignment(self.tokenizers, self.fallback_id) for _ in self.prompts]
        self.seq = CachedSequence(self.model, len(self.prompts), self.device)
        updates = [row.sync(prompt) for row, prompt in zip(self.rows, self.prompts, strict=True)]
        if not self._fits(updates, 0):
            return
        self._feed(updates)

    def _committed(self, buffer: TokenBuffer, index: int) -> list[int]:
        """Active row `index`'s committed target tokens, without the prompt's padding."""
        row = buffer.active_rows[index]
        return self.prompts[index] + buffer.host_tokens[row][self.prompt_length :]

    def _fits(self, updates: list[tuple[int, list[int]]], num_tokens: int) -> bool:
        """Whether every row can be fed its update and `num_tokens - 1` drafts within the draft's position table;
        otherwise the draft stops for good (positions only grow)."""
        if self.position_limit is None:
            return True
        if max(keep + len(feed) for keep, feed in updates) + max(num_tokens - 1, 0) <= self.position_limit:
            return True
        self.exhausted, self.seq = True, None
        return False

    def _feed(self, updates: list[tuple[int, list[int]]]) -> torch.Tensor:
        """Roll each row's draft cache back to its first `keep` tokens and feed it `feed` (right-aligned, holes
        on the left); the draft's float32 logits after each row's last token `(A, draft_vocab)`."""
        assert self.seq is not None
        width = max(len(feed) for _, feed in updates)
        ids = [[0] * (width - len(feed)) + feed for _, feed in updates]
        valid = [[False] * (width - len(feed)) + [True] * len(feed) for _, feed in updates]
        # Each row's tokens at its own positions after the `keep` it holds; holes at positions kept in range.
        positions = [
            [max(keep - width + len(feed), 0)] * (width - len(feed)) + list(range(keep, keep + len(feed)))
            for keep, feed in updates
        ]
        keep = torch.tensor([keep for keep, _ in updates], device=self.device)
        self.seq.keep_before(keep)
        out = self.seq.forward(
            self._embeddable(torch.tensor(ids, device=self.device)),
            torch.tensor(valid, device=self.device),
            torch.tensor(positions, device=self.device),
            chain_structure(width, self.device),
            logits_to_keep=1,
        )
        # A sliding-window draft forgets slots that left the window, as if positions only grew: a row rolled back
        # r tokens next step then misses up to r keys at the window's far end (its drafts only, never the output).
        self.seq.maybe_compact()
        return out.logits[:, -1].float()

    def _embeddable(self, ids: torch.Tensor) -> torch.Tensor:
        """`ids` with those the draft has no embedding for (a tokenizer with more tokens) replaced by 0."""
        return ids.masked_fill(ids >= self.num_embeddings, 0)

    def draft_chain(self, buffer: TokenBuffer, next_position: torch.Tensor, costs: CostModel, max_tokens: int) -> Chain:
        """Draft up to `schedule.current` draft tokens (at most `max_tokens`, at least one) for every active row,
        and return them as target tokens: re-encoded text when greedy (rows then propose different numbers of
        tokens, `Chain.lengths`), shared tokens with the distributions q they were drawn from when sampling."""
        active, target_device = len(buffer.active_rows), buffer.tokens.device
        nothing = Chain(torch.zeros(active, 0, dtype=torch.long, device=target_device))
        if self.exhausted:
            return nothing
        num_tokens = max(1, min(self.schedule.current, max_tokens))
        committed = [self._committed(buffer, i) for i in range(active)]
        updates = [row.sync(ids) for row, ids in zip(self.rows, committed, strict=True)]
        if not self._fits(updates, num_tokens):
            return nothing
        logits = self._feed(updates)  # (A, Vd)
        contexts = [row.draft_ids[-CONTEXT:] for row in self.rows]
        if self.do_sample:
            return self._sample_chain(buffer, logits, num_tokens, costs)
        drafted = self._draft(buffer, logits, num_tokens, costs, self._greedy)
        return self._proposals(committed, contexts, drafted.tolist(), target_device)

    def _draft(
        self,
        buffer: TokenBuffer,
        logits: torch.Tensor,
        num_tokens: int,
        costs: CostModel,
        choose: Callable[[TokenBuffer, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """Draft up to `num_tokens` draft tokens `(A, k)` autoregressively from the draft's logits `(A, Vd)` after
        each row's text: `choose(buffer, logits, j)` gives position j's draft ids `(A,)` and the probabilities
        `(A, V)` the length schedule weighs. Every draft but the last is fed to the draft, at each row's own
        positions, and recorded as its tokens."""
        assert self.seq is not None
        policy = self.schedule
        policy.start_step(buffer.lagging if policy.adaptive else None)
        base = torch.tensor([len(row.draft_ids) for row in self.rows], device=self.device)  # first draft's position
        drafted: list[torch.Tensor] = []  # (A,) each
        for j in range(num_tokens):
            token, confidence = choose(buffer, logits, j)
            drafted.append(token)
            if j + 1 == num_tokens or (policy.may_stop and policy.should_stop(confidence, costs)):
                break
            ids, positions = self._embeddable(token[:, None]), (base + j)[:, None]
            logits = self.seq.forward(ids, None, positions, chain_structure(1, self.device), 1).logits[:, -1].float()
        tokens = torch.stack(drafted, dim=1)  # (A, k)
        if tokens.shape[1] > 1:  # the last draft is never fed
            for row, ids in zip(self.rows, tokens[:, :-1].tolist(), strict=True):
                row.fed(ids)
        return tokens

    def _greedy(self, buffer: TokenBuffer, logits: torch.Tensor, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The draft's argmax `(A,)` among the ids its tokenizer decodes, and its probabilities `(A, Vd)`."""
        confidence = torch.softmax(logits, dim=-1) if self.schedule.may_stop else logits
        return logits[:, : self.draft_tokens].argmax(dim=-1), confidence

    def _sample_chain(self, buffer: TokenBuffer, logits: torch.Tensor, num_tokens: int, costs: CostModel) -> Chain:
        """Shared tokens drawn from q at each draft position, as target tokens `(A, k)`, with q `(A, k, V)`; rows
        whose q fell on a token the draft cannot read stop there (`Chain.lengths`)."""
        target_device = buffer.tokens.device
        proposed: list[torch.Tensor] = []  # target ids, (A,) each
        probs: list[torch.Tensor] = []
        lengths = torch.full((len(self.rows),), num_tokens, dtype=torch.long, device=target_device)

        def choose(buffer: TokenBuffer, logits: torch.Tensor, j: int) -> tuple[torch.Tensor, torch.Tensor]:
            nonlocal lengths
            token, q, lengths = self._sample(buffer, logits, lengths, j)
            proposed.append(token)
            probs.append(q)
            return self._to_draft(token), q.masked_fill((lengths <= j)[:, None], 0.0)

        drafted = self._draft(buffer, logits, num_tokens, costs, choose)
        k = drafted.shape[1]
        cut = None if bool((lengths >= k).all()) else lengths.clamp_max(k)
        return Chain(torch.stack(proposed, dim=1), q=torch.stack(probs, dim=1), lengths=cut, forwards=k)

    def _sample(
        self, buffer: TokenBuffer, logits: torch.Tensor, lengths: torch.Tensor, j: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Draw draft position j's target tokens `(A,)` from q `(A, V)`, the draft's logits `(A, Vd)` on the shared
        tokens processed as the target's are; rows whose q falls on a token the draft cannot read back stop
        drafting after it (`lengths`)."""
        assert self.shared is not None
        target_device = buffer.tokens.device
        scores = self.shared.target_logits(logits).to(target_device)[:, None]  # (A, 1, V)
        if self.processors.processors:
            scores = self.processors(buffer, buffer.active, buffer.active_lengths + j, scores)
        token, q = sample_draft(scores[:, 0], self.generator)  # (A,), (A, V)
        if not self.processors.prefix_free:  # the next position's processors read it as prefix
            buffer.write(j, token[:, None])
        unread = self.shared.target_to_draft[token.to(self.device)] < 0  # q certain on an unshared token
        lengths = torch.where(unread.to(target_device), lengths.clamp_max(j + 1), lengths)
        return token, q, lengths

    def _to_draft(self, token: torch.Tensor) -> torch.Tensor:
        """The draft ids `(A,)` of shared target tokens `(A,)` (0 for an unshared one: the row stopped there)."""
        assert self.shared is not None
        return self.shared.target_to_draft[token.to(self.device)].clamp_min(0)

    def _proposals(
        self, committed: list[list[int]], contexts: list[list[int]], drafted: list[list[int]], device: torch.device
    ) -> Chain:
        """Greedy drafts `(A, k)` as target tokens: each row's text re-encoded, cut at `max_depth` and at the
        first id the target cannot score; rows shorter than the longest padded (`Chain.lengths`)."""
        rows = []
        for ids, context, new in zip(committed, contexts, drafted, strict=True):
            tokens = target_proposal(self.tokenizers, ids, context, new)[: self.max_depth]
            scored = next((i for i, token in enumerate(tokens) if not 0 <= token < self.vocab_size), len(tokens))
            rows.append(tokens[:scored])
        width = max(len(tokens) for tokens in rows)
        padded = [tokens + [0] * (width - len(tokens)) for tokens in rows]
        tokens = torch.tensor(padded, dtype=torch.long).reshape(len(rows), width).to(device)
        lengths = [len(tokens) for tokens in rows]
        cut = None if min(lengths) == width else torch.tensor(lengths, dtype=torch.long).to(device)
        return Chain(tokens, lengths=cut, forwards=len(drafted[0]))

    def commit_chain(
        self,
        num_accepted: torch.Tensor,
        num_drafted: int,
        next_token: torch.Tensor,
        outcome: StepOutcome | None = None,
    ) -> None:
        """Let the length schedule learn from the step (the draft reads the committed text at its next step)."""
        host = outcome.num_accepted if outcome is not None else num_accepted.tolist()
        self.schedule.update(num_drafted, host)

    def select_rows(self, keep: torch.Tensor) -> None:
        """Follow the batch when finished rows leave it (`keep`: positions in the old active order)."""
        kept = keep.tolist()
        self.rows = [self.rows[i] for i in kept]
        self.prompts = [self.prompts[i] for i in kept]
        if self.seq is not None:
            self.seq.select_rows(keep.to(self.device))
