"""A separate, smaller causal LM that drafts tokens for the target to verify.

The draft keeps its own KV cache across steps. Its cache always lags the committed text by one or two
tokens ("pending"): the token the target just chose, plus the last drafted token when the target accepted
every draft (that token was proposed but never fed back through the draft). A step feeds the pending tokens
and then drafts autoregressively, so no token is ever recomputed.

The draft's prefill waits for the first step that would draft with it (`room`), which first asks whether
starting the draft pays for its prefill (`hf_specdec.generation.decisions.draft_model_pays`): where it does not
(a batch on a CPU, few tokens left) the draft never runs, and its steps are plain (or prompt lookup's).
"""

from __future__ import annotations

import time
import weakref

import torch
from torch import nn
from torch.nn import functional
from transformers import GenerationConfig, PreTrainedModel
from transformers.utils import ModelOutput

from hf_specdec.drafters.draft_length import DraftLengthPolicy
from hf_specdec.drafters.vocab import VocabularyRows, check_token_ids
from hf_specdec.generation.decisions import CostModel, draft_model_pays
from hf_specdec.generation.drafter import Accepted, Chain, ChainDrafter
from hf_specdec.generation.kv_cache import CachedSequence, static_capacity, wants_compile
from hf_specdec.generation.positions import position_table_limit
from hf_specdec.generation.prefill import prefill_by_span
from hf_specdec.generation.processing import RaggedLogitsProcessor
from hf_specdec.generation.readback import HostReads, StepOutcome
from hf_specdec.generation.sequences import TokenBuffer
from hf_specdec.generation.validation import output_vocab_size
from hf_specdec.trees.masks import chain_structure


class DraftModelDrafter(ChainDrafter):
    """Proposes a chain of tokens per row with a draft model.

    Args:
        model (`PreTrainedModel`): the draft model, sharing the target's vocabulary.
        target_vocab_size (`int`): size of the target's logits; the draft's are cut or padded to it.
        processors (`RaggedLogitsProcessor`): the same processors the target's scores go through.
        do_sample (`bool`): sample drafts from q (and return q) instead of taking the argmax.
        generator (`torch.Generator`, *optional*): randomness for sampling.
        token_ids (`torch.LongTensor`, *optional*): a draft vocabulary (see `hf_specdec.drafters.vocab`): the draft then
            runs its decoder and projects onto these rows of its lm_head only, and proposes only these tokens;
            its distribution q is the softmax over them (zero elsewhere), which keeps sampling exact.
        schedule (`DraftLengthPolicy`, *optional*): how many tokens a step drafts (adaptive by default).
        reads (`HostReads`, *optional*): the loop's one read per step, which the draft's cache bookkeeping joins.
        generation_config (`GenerationConfig`, *optional*): the call's; with `cache_implementation="static"` the
            draft keeps a static cache too, compiled where the target's forward is (`kv_cache.wants_compile`).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        target_vocab_size: int,
        processors: RaggedLogitsProcessor,
        do_sample: bool,
        generator: torch.Generator | None = None,
        token_ids: torch.Tensor | None = None,
        schedule: DraftLengthPolicy | None = None,
        reads: HostReads | None = None,
        generation_config: GenerationConfig | None = None,
    ) -> None:
        self.model = model
        self.reads = reads
        self.generation_config = generation_config
        self.schedule = DraftLengthPolicy() if schedule is None else schedule
        self.max_depth = self.schedule.max_tokens
        self.device = model.device
        self.target_vocab_size = target_vocab_size
        self.token_ids: torch.Tensor | None = None
        self._projection: tuple[torch.Tensor, torch.Tensor | None] | None = None
        if token_ids is not None:
            self.token_ids, self._projection = _restricted_head(model, token_ids, target_vocab_size)
        # Ids past the draft's embedding matrix (a target whose matrices are padded to more rows than the
        # draft's) are never drafted, and are fed to the draft as id 0: it drafts from a context it misreads
        # there, which verification makes up for.
        self.num_embeddings = int(model.get_input_embeddings().weight.shape[0])
        # Whether some of the target's ids get -inf from the draft whatever the processors do.
        self.scores_fewer_ids = token_ids is not None or min(output_vocab_size(model), self.num_embeddings) < (
            target_vocab_size
        )
        self.processors = processors
        self.do_sample = do_sample
        self.generator = generator
        # A draft with a learned table of absolute positions (GPT-2's) cannot embed a position past its end: it
        # drafts no further than that, and once no row can draft, it stops following the text (`exhausted`).
        self.position_limit = position_table_limit(model)
        self.exhausted = False
        self.seq: CachedSequence | None = None
        self._fed = 0  # slots the current step appended to the draft's cache
        self._pending_width = 0  # of which the pending tokens fed first
        self._last_drafts: torch.Tensor | None = None
        # Committed tokens the draft has not seen, right-aligned (the most recent last): after its own steps the
        # target's token, and the last draft when all were accepted; after a lookup step (`catch_up`) more.
        self.pending: torch.Tensor | None = None  # (A, W)
        self.pending_count: torch.Tensor | None = None  # (A,) how many of the last columns are real
        self._pending_most = 1  # at least pending_count.max(), known on the host
        # The prompts, until the draft is first fed them (`room`): `(ids, valid, positions)` and the tokens
        # its prefill will compute.
        self._prompts: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._prompt_tokens = 0
        self._by_span = True
        self._started = False  # whether the step being drafted began with the draft's prefill

    def prefill(self, input_ids: torch.Tensor, valid: torch.Tensor, positions: torch.Tensor) -> None:
        """See the prompts `(batch, prompt)` (the target's first token becomes pending in `start`); the draft is
        fed them at the first step that drafts with it (`room`)."""
        if self.position_limit is not None and int(positions.max()) + 1 >= self.position_limit:
            self._exhaust()  # the prompts already fill the draft's positions: nothing left to draft at
            return
        # Prefilled by span, the draft computes the real tokens only; with a static cache, every column.
        self._by_span = self._runner_capacity()[1] is None
        self._prompt_tokens = int(valid.sum()) if self._by_span else valid.numel()
        self._prompts = (input_ids.to(self.device), valid.to(self.device), positions.to(self.device))

    def _runner_capacity(self) -> tuple[nn.Module, int | None]:
        """The module the draft's forwards run (with a draft vocabulary its decoder alone: `_logits` projects onto
        the vocabulary's rows) and its static cache's slots (`None`: a dynamic cache)."""
        runner = self.model if self.token_ids is None else self.model.get_decoder()
        config = self.generation_config
        return runner, static_capacity(config, runner) if config is not None else None

    @property
    def declined(self) -> bool:
        """Whether the draft is not started (starting it has not been expected to pay so far)."""
        return self._prompts is not None

    def room(self, next_position: torch.Tensor, costs: CostModel, max_tokens: int) -> int:
        """`room_to_draft`, once the draft is started: before its first draft, a step asks whether starting it
        pays for its prefill (`draft_model_pays`, over the `max_tokens` tokens the least advanced row has left;
        with the adaptive schedule only) and feeds it the prompts if so; 0 where it does not (yet)."""
        room = self.room_to_draft(next_position)
        if room < 1 or self._prompts is None:
            return room
        # A constant schedule drafts at every step, as asked (the speculation gate is off too).
        judged, rows = self.schedule.adaptive, next_position.shape[0]
        if judged and not costs.draft_measured and costs.knows_plain(rows):
            costs.observe_draft_probe(self._probe(rows), rows)
            self._started = True  # a one-off in this step's time, which then measures nothing
        if judged and not draft_model_pays(costs, rows, max_tokens, self._prompt_tokens):
            return 0
        self._prefill_now(*self._prompts)
        self._prompts, self._started = None, True
        return room

    def _probe(self, rows: int) -> float:
        """Seconds of one draft forward over one token per row, with no cache: what a draft forward costs, before
        its prefill is paid for (the second of two: the first pays for whatever the draft initialises lazily)."""
        runner, _ = self._runner_capacity()
        ids = torch.zeros(rows, 1, dtype=torch.long, device=self.device)
        seconds = []
        with torch.no_grad():
            for _ in range(2):
                started = time.perf_counter()
                out = runner(input_ids=ids, use_cache=False)
                float(out[0].flatten()[0])  # waits for the device
                seconds.append(time.perf_counter() - started)
        return min(seconds)

    def take_started(self) -> bool:
        """Whether this step fed the draft its prompts or timed its forward (then forgotten): its time is no measure
        of a step."""
        started, self._started = self._started, False
        return started

    def _prefill_now(self, input_ids: torch.Tensor, valid: torch.Tensor, positions: torch.Tensor) -> None:
        """Feed the prompts `(batch, prompt)` to the draft (the rows still decoding)."""
        runner, capacity = self._runner_capacity()
        config = self.generation_config
        self.seq = CachedSequence(runner, input_ids.shape[0], self.device, self.reads, capacity=capacity)
        ids = self._embeddable(input_ids)
        if capacity is None:  # rows by span: the padding of short prompts is not computed (`prefill_by_span`)
            prefill_by_span(self.seq, ids, valid, positions)
        else:
            self.seq.forward(ids, valid, positions, chain_structure(input_ids.shape[1], self.device), logits_to_keep=1)
        compiles = capacity is not None and isinstance(runner, PreTrainedModel)
        if compiles and wants_compile(runner, self.seq.cache, config):
            self.seq.compile(config)  # as the target's forward is: the draft's many small forwards gain the most

    def start(self, first_token: torch.Tensor, hidden: torch.Tensor | None = None) -> None:
        """Record the target's first generated token `(batch,)` as pending."""
        if self.exhausted:
            return
        self.pending = torch.stack([first_token, first_token], dim=1).to(self.device)  # (B, 2)
        self.pending_count = torch.ones_like(first_token, device=self.device)
        self._pending_most = 1

    def _logits(self, outputs: ModelOutput) -> torch.Tensor:
        """Float32 logits `(A, 1, target_vocab)` at the last fed position, -inf outside a draft vocabulary."""
        if self._projection is None:
            return self._to_target_vocab(outputs.logits[:, -1:].float())
        # 2D on purpose: a (A, 1, H) slice of a wider output keeps its batch stride, and torch's CPU bf16 linear
        # takes a path 20x slower for such inputs when the weight is a plain tensor (torch 2.13).
        return self._project(outputs.last_hidden_state[:, -1])[:, None]  # (A, 1, V)

    def _all_logits(self, outputs: ModelOutput) -> torch.Tensor:
        """Float32 logits `(A, F, target_vocab)` at every fed position, -inf outside a draft vocabulary."""
        if self._projection is None:
            return self._to_target_vocab(outputs.logits.float())
        return self._project(outputs.last_hidden_state)

    def _project(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits `(..., target_vocab)` of hidden states `(..., H)` through the draft vocabulary's rows."""
        assert self._projection is not None and self.token_ids is not None
        weight, bias = self._projection
        restricted = functional.linear(hidden.to(weight.device), weight, bias).float().to(hidden.device)
        logits = restricted.new_full((*restricted.shape[:-1], self.target_vocab_size), float("-inf"))
        return logits.index_copy_(-1, self.token_ids.to(hidden.device), restricted)

    def _pending_inputs(
        self, next_position: torch.Tensor, last_position: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What a step feeds first: the committed tokens the draft has not seen `(A, w)` (right-aligned, the
        last one the root), which of them are real, and their positions (padding kept in range)."""
        assert self.pending is not None and self.pending_count is not None
        width = self._pending_most  # rows with fewer feed holes first
        self._pending_width = width
        offsets = torch.arange(-width, 0, device=self.device)  # (w,) positions relative to next_position
        ids = self.pending[:, self.pending.shape[1] - width :]  # (A, w)
        valid = offsets[None, :] >= -self.pending_count[:, None]  # (A, w)
        positions = (next_position.to(self.device)[:, None] + offsets[None, :]).clamp(0, last_position)  # (A, w)
        return ids, valid, positions

    def _embeddable(self, ids: torch.Tensor) -> torch.Tensor:
        """`ids` with those the draft has no embedding for replaced by 0."""
        if self.num_embeddings >= self.target_vocab_size:  # every id the target has
            return ids
        return ids.masked_fill(ids >= self.num_embeddings, 0)

    def _to_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Cut or pad draft logits `(..., vocab_draft)` to the target's vocabulary size, -inf for the ids the
        draft could not read back."""
        if logits.shape[-1] > self.num_embeddings:
            logits = logits.clone()
            logits[..., self.num_embeddings :] = float("-inf")
        vocab = logits.shape[-1]
        if vocab > self.target_vocab_size:
            return logits[..., : self.target_vocab_size]
        if vocab < self.target_vocab_size:
            pad = logits.new_full((*logits.shape[:-1], self.target_vocab_size - vocab), float("-inf"))
            return torch.cat([logits, pad], dim=-1)
        return logits

    def draft_chain(self, buffer: TokenBuffer, next_position: torch.Tensor, costs: CostModel, max_tokens: int) -> Chain:
        """Draft up to `schedule.current` tokens (and at most `max_tokens`, at least one) for every active row.

        Where the logits processors read the prefix, each drafted token is written into `buffer` right after the
        row's committed tokens (not committed): the processors of the next draft position read it there.

        Args:
            buffer (`TokenBuffer`): committed tokens of every row.
            next_position (`torch.LongTensor` of shape `(active,)`): logical position of the first draft.
            costs (`CostModel`): the loop's, which the adaptive schedule weighs each next draft against.
            max_tokens (`int`): how many tokens any row can still commit after this step's first.

        Returns:
            A `Chain`: `(active, k)` drafted tokens on the buffer's device, and when sampling the draft
            distributions `(active, k, vocab)` they were drawn from; one draft forward per drafted token.
        """
        policy = self.schedule
        target_device = buffer.tokens.device
        room = self.room(next_position, costs, max_tokens)
        if room < 1:
            nothing = torch.zeros(next_position.shape[0], 0, dtype=torch.long, device=target_device)
            return Chain(nothing, plain=self.declined, started=self.take_started())
        num_tokens = min(max(1, min(policy.current, max_tokens)), room)
        assert self.seq is not None and self.pending is not None and self.pending_count is not None
        last_position = buffer.max_length - 1  # no token past it can be committed; keep positions in range
        ids, pending_valid, positions = self._pending_inputs(next_position, last_position)
        valid: torch.Tensor | None = pending_valid  # then None: the draft's own tokens are all real
        tokens: list[torch.Tensor] = []
        probs: list[torch.Tensor] = []
        self._fed = self._pending_width
        policy.start_step(buffer.lagging if policy.adaptive else None)  # only the adaptive rule weighs rows
        # Rows whose processors rule out every token the draft can propose stop drafting there: their later
        # positions are filler, never shown to the processors and never accepted. Only a draft that cannot score
        # every id, or processors that read the prefix (constraints), can leave a row nothing; otherwise this
        # bookkeeping is skipped. Processors that take any prefix are shown every row, cut or not, and the host
        # reads nothing to choose which (`exact` otherwise: one read per draft position).
        track = self.scores_fewer_ids or not self.processors.prefix_free
        exact = track and not self.processors.any_prefix
        lengths = torch.full((ids.shape[0],), num_tokens, dtype=torch.long, device=target_device)
        lengths_now = buffer.active_lengths
        # Where the draft's own tokens go: drafted token j at the position after it (all of them real).
        own_positions = next_position.to(self.device)[:, None] + torch.arange(num_tokens, device=self.device)
        own_positions = own_positions.clamp_max(last_position)
        for j in range(num_tokens):
            outputs = self.seq.forward(
                self._embeddable(ids), valid, positions, chain_structure(ids.shape[1], self.device), 1
            )
            logits = self._logits(outputs).to(target_device)  # (A, 1, V)
            scores, lengths = self._scores(buffer, logits, lengths, j, track, exact)
            if self.do_sample:
                token, q = sample_draft(scores, self.generator)  # (A,), (A, V)
                probs.append(q)
            else:
                token = scores.argmax(dim=-1)
            tokens.append(token)
            if not self.processors.prefix_free:  # the next position's processors read it as prefix
                buffer.write(j, token[:, None])
            if track:  # plain decoding scores nothing after an EOS, nor past the length limit
                ended = lengths_now + j + 1 >= buffer.max_length
                if buffer.eos is not None:
                    ended |= torch.isin(token, buffer.eos)
                lengths = torch.where(ended, lengths.clamp_max(j + 1), lengths)
            if j + 1 == num_tokens or (exact and not bool((lengths > j + 1).any())):
                break
            if policy.may_stop:  # rows that stopped drafting gain nothing from another draft: confidence 0
                confidence = q if self.do_sample else torch.softmax(scores, dim=-1)
                if track:
                    confidence = confidence.masked_fill((lengths <= j)[:, None], 0.0)
                if policy.should_stop(confidence, costs):
                    break
            ids, valid, positions = token[:, None].to(self.device), None, own_positions[:, j : j + 1]
            self._fed += 1
        draft_tokens = torch.stack(tokens, dim=1)  # (A, k)
        self._last_drafts = draft_tokens[:, -1].to(self.device)  # pending next step if all are accepted
        q = torch.stack(probs, dim=1) if self.do_sample else None
        k = draft_tokens.shape[1]
        catch_up = self._pending_width > 2  # more than the step's own pending tokens (`Proposal.catch_up`)
        started = self.take_started()
        if not track or (exact and bool((lengths >= k).all())):
            return Chain(draft_tokens, q=q, forwards=k, catch_up=catch_up, started=started)
        return Chain(draft_tokens, q=q, lengths=lengths.clamp_max(k), forwards=k, catch_up=catch_up, started=started)

    def room_to_draft(self, next_position: torch.Tensor) -> int:
        """How many tokens a step starting at `next_position` `(active,)` can draft before some row's draft
        positions pass the draft's position table (a step feeds positions up to `next_position + k - 2`: the last
        draft is never fed); unbounded for drafts that take any position. Once it is 0, the draft stops for good
        (`exhausted`: positions only grow)."""
        if self.exhausted:
            return 0
        if self.position_limit is None:
            return 1 << 30
        room = self.position_limit + 1 - int(next_position.max())
        if room < 1:
            self._exhaust()
        return max(room, 0)

    def _exhaust(self) -> None:
        """Stop drafting for good (positions only grow): drop the draft's cache and what it had not seen."""
        self.exhausted = True
        self.seq, self._prompts = None, None
        self.pending = self.pending_count = self._last_drafts = None

    def _scores(
        self, buffer: TokenBuffer, logits: torch.Tensor, lengths: torch.Tensor, j: int, track: bool, exact: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Processed scores `(A, V)` at draft position j, and the rows' draft lengths (cut where `track`ed rows
        have nothing left, see `_score_drafting_rows`)."""
        if track:
            return self._score_drafting_rows(buffer, logits, lengths, j, exact)
        if self.processors.processors:  # prefix-free: the positions do not matter
            return self.processors(buffer, buffer.active, buffer.active_lengths + j, logits)[:, 0], lengths
        return logits.view(logits.shape[0], logits.shape[2]), lengths

    def _score_drafting_rows(
        self, buffer: TokenBuffer, logits: torch.Tensor, lengths: torch.Tensor, j: int, exact: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Processed scores `(A, V)` at draft position j for the rows still drafting (`lengths > j`), and the
        lengths with the rows the processors leave nothing cut at j (their scores: zeros, any filler token).
        Unless `exact`, the processors score every row (they take any prefix) and the host reads nothing."""
        if exact:
            drafting = (lengths > j).nonzero(as_tuple=True)[0]  # (D,)
            scores = logits[:, 0].clone()
            scores[drafting] = self.processors(
                buffer, buffer.active[drafting], buffer.active_lengths[drafting] + j, logits[drafting]
            )[:, 0]
        else:
            host_lengths = [length + j for length in buffer.active_host_lengths]
            scores = self.processors(buffer, buffer.active, buffer.active_lengths + j, logits, host_lengths)[:, 0]
        scores = scores.masked_fill(torch.isnan(scores), float("-inf"))  # a draft never proposes a nan's token
        stopped = torch.isneginf(scores).all(dim=-1) | (lengths <= j)  # (A,) nothing left
        lengths = torch.where(stopped, lengths.clamp_max(j), lengths)
        return torch.where(stopped[:, None], 0.0, scores), lengths

    def commit_chain(
        self,
        num_accepted: torch.Tensor,
        num_drafted: int,
        next_token: torch.Tensor,
        outcome: StepOutcome | None = None,
    ) -> None:
        """Roll the draft's cache back to the accepted drafts, queue the tokens it has not seen, and let the
        length schedule learn from the step.

        Args:
            num_accepted (`torch.LongTensor` of shape `(active,)`): accepted drafts per row.
            num_drafted (`int`): k, the number drafted this step (the last one was never fed to the draft).
            next_token (`torch.LongTensor` of shape `(active,)`): the target's token after the accepted ones.
            outcome (`StepOutcome`, *optional*): the step's counts as host values (read here when not given).
        """
        if self.exhausted:
            return
        if self._prompts is not None:  # not started: the step drafted nothing, and the target's token is queued
            self.catch_up(next_token[:, None], torch.ones_like(next_token), 1)
            return
        assert self.seq is not None and self.pending is not None
        host = outcome.num_accepted if outcome is not None else num_accepted.tolist()
        self.schedule.update(num_drafted, host)
        num_accepted = num_accepted.to(self.device)
        kept_drafts = torch.clamp(num_accepted, max=num_drafted - 1)  # the last draft was never fed
        keep_max = self._pending_width + min(max(host, default=0), num_drafted - 1)
        self.seq.keep_prefix(self._fed, self._pending_width + kept_drafts, keep_max)
        self.seq.maybe_compact()
        self._pending_most = 2 if num_drafted in host else 1
        all_accepted = num_accepted == num_drafted
        next_token = next_token.to(self.device)
        first = torch.where(all_accepted, self._last_drafts, next_token)  # (A,)
        self.pending = torch.stack([first, next_token], dim=1)  # (A, 2)
        self.pending_count = 1 + all_accepted.long()

    def catch_up(self, tokens: torch.Tensor, counts: torch.Tensor, most: int | None = None) -> None:
        """Queue tokens the target committed in a step this draft did not draft (a prompt lookup step): row b
        committed `tokens[b, :counts[b]]`. The draft feeds them, after what it had not seen yet, in one forward
        at its next proposal.

        Args:
            tokens (`torch.LongTensor` of shape `(active, m)`): the committed tokens, in order.
            counts (`torch.LongTensor` of shape `(active,)`): how many of them each row committed, `>= 1`.
            most (`int`, *optional*): at least `counts.max()`, known on the host (all m by default).
        """
        if self.exhausted:
            return
        assert self.pending is not None and self.pending_count is not None
        tokens, counts = tokens.to(self.device), counts.to(self.device)
        seen_most, m = min(self._pending_most, self.pending.shape[1]), tokens.shape[1]
        width = seen_most + (m if most is None else min(most, m))
        # Right-aligned per row: the pending tokens the draft has not seen, then the committed ones.
        merged = torch.cat([self.pending[:, self.pending.shape[1] - seen_most :], tokens], dim=1)  # (A, seen_most+m)
        seen = self.pending_count.clamp_max(seen_most)  # (A,)
        total = seen + counts  # (A,)
        offset = torch.arange(width, device=self.device)[None, :] - (width - total)[:, None]  # (A, width)
        # Row b's tokens are merged[b, seen_most - seen[b] : seen_most + counts[b]], contiguous.
        source = seen_most - seen[:, None] + offset
        pending = merged.gather(1, source.clamp(0, merged.shape[1] - 1))
        self.pending = pending.masked_fill(offset < 0, 0)
        self.pending_count = total
        self._pending_most = width

    def follow(self, accepted: Accepted) -> None:
        """A plain step: queue the target's token, fed with the rest at the next proposal."""
        most = None if accepted.outcome is None else accepted.outcome.max_accepted + 1
        self.catch_up(accepted.tokens, accepted.num_accepted + 1, most)

    def select_rows(self, keep: torch.Tensor) -> None:
        """Follow the batch when finished rows leave it (`keep`: positions in the old active order)."""
        if self.exhausted:
            return
        assert self.pending is not None and self.pending_count is not None
        keep = keep.to(self.device)
        if self._prompts is not None:
            self._prompts = (self._prompts[0][keep], self._prompts[1][keep], self._prompts[2][keep])
            valid = self._prompts[1]
            self._prompt_tokens = int(valid.sum()) if self._by_span else valid.numel()
        else:
            assert self.seq is not None
            self.seq.select_rows(keep)
        self.pending = self.pending[keep]
        if self._last_drafts is not None:
            self._last_drafts = self._last_drafts[keep]
        self.pending_count = self.pending_count[keep]


def sample_draft(scores: torch.Tensor, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """A drafted token per row `(A,)` sampled from processed scores `(A, V)`, and the distribution q `(A, V)` it
    was drawn from (`draft_distribution`), which acceptance divides by."""
    q = draft_distribution(scores)
    return torch.multinomial(q, 1, generator=generator).squeeze(1), q


def draft_distribution(scores: torch.Tensor) -> torch.Tensor:
    """The distribution q `(A, V)` a draft samples from, given its processed scores `(A, V)`: their softmax,
    with a nan score never drawn; a row whose scores leave no finite distribution (all -inf or nan, or a +inf)
    drafts its best-scored token with certainty. Any q keeps sampling exact as long as acceptance divides by
    the same q the draft was drawn from, so a broken draft only costs acceptance, never correctness."""
    scores = scores.nan_to_num(nan=float("-inf"), posinf=torch.finfo(scores.dtype).max)
    q = torch.softmax(scores, dim=-1)
    broken = ~torch.isfinite(q).all(dim=-1, keepdim=True)  # (A, 1): every score -inf
    certain = torch.zeros_like(q).scatter_(-1, scores.argmax(dim=-1, keepdim=True), 1.0)
    return torch.where(broken, certain, q)


# Config fields of models that transform their logits after the lm_head (Gemma 2/3, Cohere, Granite).
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def _restricted_head(
    model: PreTrainedModel, token_ids: torch.Tensor, target_vocab_size: int
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor | None]]:
    """Validate a draft vocabulary and the draft's lm_head rows for it (gathered once per draft and
    vocabulary, not at every `generate()` call)."""
    lm_head = model.get_output_embeddings()
    config = model.config.get_text_config(decoder=True)
    for name in LOGIT_TRANSFORMS:
        if getattr(config, name, None) not in (None, 1.0):
            raise ValueError(
                f"The draft rescales its logits after the lm_head (`{name}` in its config), which `assistant_vocab` "
                "would skip, making its sampling distribution wrong for acceptance: drop `assistant_vocab`."
            )
    token_ids = check_token_ids(token_ids, min(output_vocab_size(model), target_vocab_size), "`assistant_vocab`")
    rows = _DRAFT_ROWS.setdefault(lm_head, VocabularyRows())
    weight, bias = rows(lm_head, token_ids)
    return token_ids.to(weight.device), (weight, bias)


# One cache of gathered rows per draft lm_head, kept as long as the draft lives.
_DRAFT_ROWS: weakref.WeakKeyDictionary[nn.Module, VocabularyRows] = weakref.WeakKeyDictionary()
