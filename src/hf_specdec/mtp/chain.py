"""The model's own multi-token-prediction (MTP) layers as a drafter: with K layers, a chain of K tokens per row
and step (`hf_specdec.mtp.layers` says what a layer computes).

Slots are the committed positions t of a row. Layer k's cache holds slot t once the token it reads there,
x_{t+k+1}, is committed; the layers' caches thus end k slots apart. A step whose root (the row's last committed
token) sits at position n feeds every layer the slots it has not seen up to n - 1, as one chain per layer:

- layer 0 reads the target's last hidden states at the *pending* slots (those of the last step's accepted path,
  from its verification forward), with the committed tokens after them; its output at slot n - 1 drafts d_1;
- layer k reads the same committed tokens, then the drafts d_1 .. d_k, with the features layer k-1 output at the
  same slots (and one it output at the previous step: the slot where layer k's own lag starts); its output at
  slot n - 1 drafts d_{k+1}.

After verification each layer drops the entries that read drafts (its last k); they come back at the next step
with committed tokens and features. A plain step (the loop verifies the root alone) only adds a pending slot.

Drafts are drawn from q (the softmax of the MTP logits after the call's logits processors), and q goes with the
chain, so sampling keeps the target's distribution exactly (min(1, p/q), then the residual); greedy decoding
keeps plain greedy's tokens whatever the drafts.
"""

from __future__ import annotations

import torch
from transformers.modeling_layers import MtpModel

from hf_specdec.drafters.draft_model import sample_draft
from hf_specdec.generation.decisions import CostModel
from hf_specdec.generation.drafter import Accepted, DraftingContext, Proposal, append_pending, chain_proposal
from hf_specdec.generation.kv_cache import CachedSequence
from hf_specdec.generation.sequences import TokenBuffer
from hf_specdec.mtp.layers import MtpLayerStep, layer_sequence, mtp_logits
from hf_specdec.trees.masks import chain_structure


class MtpDrafter:
    """Drafts a chain of `len(mtp.layers)` tokens per row with the target's MTP layers (see the module's
    docstring).

    Args:
        context (`DraftingContext`): the loop's context (processors, sampling, vocabulary size).
        mtp (`MtpModel`): the target's MTP layers (sharing its embeddings and lm_head).
    """

    hidden_state_layers = (-1,)

    def __init__(self, context: DraftingContext, mtp: MtpModel) -> None:
        self.steps = [MtpLayerStep(mtp, k) for k in range(len(mtp.layers))]
        self.num_layers = len(self.steps)
        self.max_depth = self.num_layers
        self.mtp = mtp
        self.embeddings = mtp.embed_tokens
        self.processors, self.do_sample, self.generator = context.processors, context.do_sample, context.generator
        self.vocab_size = context.vocab_size
        self.reads = context.reads
        self.device = mtp.layers[0].eh_proj.weight.device
        self.seqs: list[CachedSequence] = []
        self._prompt: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        # Pending slots, left-aligned: the target's hidden state there, the committed token after it, how many
        # per row, and the position of the first such token (they are consecutive).
        self.hidden: torch.Tensor | None = None  # (A, W, H)
        self.tokens: torch.Tensor | None = None  # (A, W)
        self.count: torch.Tensor | None = None  # (A,)
        self.start_position: torch.Tensor | None = None  # (A,)
        # For layer k >= 1 (entry k - 1): layer k-1's feature at the slot where layer k's unseen slots start.
        self.carried: list[torch.Tensor] = []  # each (A, 1, H)
        self.carried_valid: list[torch.Tensor] = []  # each (A,): a real slot (short prompts have none)
        self._fed: list[int] = []  # entries each layer appended in the current step
        self._next_carried: list[torch.Tensor] = []
        self._next_carried_valid: list[torch.Tensor] = []

    # -- the prompt ---------------------------------------------------------------------------------------------

    def prefill(self, input_ids: torch.Tensor, valid: torch.Tensor, positions: torch.Tensor) -> None:
        """Keep the prompts: the layers need the target's hidden states on them too (`start`)."""
        self._prompt = (input_ids, valid, positions)

    def start(self, first_token: torch.Tensor, hidden: torch.Tensor | None) -> None:
        """Feed every layer the prompt slots whose tokens it reads are all known; the last prompt slot (whose
        hidden state chose `first_token`) stays pending. Continuing a cache, `hidden` covers the new columns only:
        the layers' context starts there (at their logical positions), which can lower acceptance, not the output."""
        assert self._prompt is not None and hidden is not None
        input_ids, valid, positions = (t.to(self.device) for t in self._prompt)
        self._prompt = None
        following = torch.cat([input_ids[:, 1:], first_token[:, None].to(self.device)], dim=1)  # (B, L)
        cut = input_ids.shape[1] - hidden.shape[1]  # the cached columns, which have no hidden state
        input_ids, valid, positions, following = (t[:, cut:] for t in (input_ids, valid, positions, following))
        batch, length = input_ids.shape
        hidden = hidden.to(self.device, self.steps[0].dtype)
        self.seqs = [layer_sequence(step, batch, self.device, self.reads) for step in self.steps]
        self.carried, self.carried_valid = [], []
        features: torch.Tensor | None = hidden
        for k, seq in enumerate(self.seqs):
            width = length - 1 - k  # layer k's prompt slots t <= L-2-k read x_{t+k+1} <= x_{L-1}
            if k > 0:
                column = length - 1 - k  # the slot where layer k's unseen slots start
                if features is not None and column >= 0:
                    self.carried.append(features[:, column : column + 1])
                    self.carried_valid.append(valid[:, column].clone())
                else:
                    self.carried.append(hidden.new_zeros(batch, 1, hidden.shape[-1]))
                    self.carried_valid.append(torch.zeros(batch, dtype=torch.bool, device=self.device))
            if width < 1 or features is None:
                features = None
                continue
            features = seq.forward(
                None,
                valid[:, :width],
                positions[:, k + 1 : k + 1 + width],
                chain_structure(width, self.device),
                inputs_embeds=self._inputs(features[:, :width], following[:, k : k + width]),
            ).last_hidden_state
        self.hidden, self.tokens = hidden[:, -1:], following[:, -1:]
        self.count = torch.ones(batch, dtype=torch.long, device=self.device)
        self.start_position = positions[:, -1] + 1

    # -- a step -------------------------------------------------------------------------------------------------

    def propose(
        self,
        buffer: TokenBuffer,
        last_token: torch.Tensor,
        next_position: torch.Tensor,
        costs: CostModel,
        max_tokens: int,
    ) -> Proposal:
        """Feed every layer its unseen slots and draft one token per layer; propose the first `max_tokens` (at
        least one) as each row's chain."""
        assert self.hidden is not None and self.tokens is not None
        assert self.count is not None and self.start_position is not None
        rows, width = self.tokens.shape
        count, layers = self.count, self.num_layers
        offsets = torch.arange(width + layers, device=self.device)
        positions = (self.start_position[:, None] + offsets).clamp_max(buffer.max_length - 1)  # (A, W+K)
        tokens = torch.cat([self.tokens, self.tokens.new_zeros(rows, layers)], dim=1)  # drafts go after `count`
        lengths = buffer.active_lengths
        target_device = last_token.device
        drafts: list[torch.Tensor] = []
        probs: list[torch.Tensor] = []
        self._fed, self._next_carried, self._next_carried_valid = [], [], []
        features = self.hidden
        valid = offsets[None, :width] < count[:, None]  # (A, W)
        for k, seq in enumerate(self.seqs):
            span = width + k
            if k > 0:  # the carried slot, then the slots layer k-1 fed (real where they were real there)
                features = torch.cat([self.carried[k - 1], features], dim=1)
                valid = torch.cat([self.carried_valid[k - 1][:, None], valid], dim=1)
                valid = valid & (offsets[None, :span] < (count + k)[:, None])  # (A, span)
                # Layer k's first entry that reads a draft: where it resumes after this step.
                self._next_carried.append(features.gather(1, count[:, None, None].expand(-1, 1, features.shape[-1])))
                self._next_carried_valid.append(valid.gather(1, count[:, None]).squeeze(1))
            out = seq.forward(
                None,
                valid,
                positions[:, :span],
                chain_structure(span, self.device),
                inputs_embeds=self._inputs(features, tokens[:, :span]),
            ).last_hidden_state  # (A, span, H)
            self._fed.append(span)
            last = out.gather(1, (count + k - 1)[:, None, None].expand(-1, 1, out.shape[-1]))  # (A, 1, H)
            logits = mtp_logits(self.mtp, last, self.vocab_size).to(target_device)  # (A, 1, V)
            if self.processors.processors:
                scores = self.processors(buffer, buffer.active, lengths + k, logits)[:, 0]
            else:
                scores = logits[:, 0]
            if self.do_sample:
                token, q = sample_draft(scores, self.generator)
                probs.append(q)
            else:
                token = scores.argmax(dim=-1)
            drafts.append(token)
            if not self.processors.prefix_free:  # the next draft's processors read it as prefix
                buffer.write(k, token[:, None])
            tokens.scatter_(1, (count + k)[:, None], token[:, None].to(self.device))
            features = out
        keep = min(layers, max(1, max_tokens))
        chain = torch.stack(drafts, dim=1)[:, :keep]
        q = torch.stack(probs, dim=1)[:, :keep] if self.do_sample else None
        return chain_proposal(last_token, chain, q, forwards=layers)

    def commit(self, accepted: Accepted) -> None:
        """Drop every layer's entries that read drafts; the accepted path's slots become pending, with the
        target's hidden states from the verification forward."""
        assert self.count is not None and self.start_position is not None and self.tokens is not None
        assert accepted.hidden is not None
        width = self.tokens.shape[1]
        for k, seq in enumerate(self.seqs):
            seq.keep_prefix(self._fed[k], self.count, keep_max=width)
            seq.maybe_compact()
        self.carried, self.carried_valid = self._next_carried, self._next_carried_valid
        self.start_position = self.start_position + self.count
        self.hidden = accepted.hidden.to(self.device, self.steps[0].dtype)  # (A, D+1, H), the root first
        self.tokens = accepted.tokens.to(self.device)  # the token after each of them
        self.count = (accepted.num_accepted + 1).to(self.device)

    def follow(self, accepted: Accepted) -> None:
        """A plain step: the root's slot (its hidden state, the target's token after it) joins the pending ones."""
        assert self.hidden is not None and self.tokens is not None and self.count is not None
        self.hidden, self.tokens, self.count = append_pending(self.hidden, self.tokens, self.count, accepted)

    def select_rows(self, keep: torch.Tensor) -> None:
        assert self.hidden is not None and self.tokens is not None
        assert self.count is not None and self.start_position is not None
        keep = keep.to(self.device)
        for seq in self.seqs:
            seq.select_rows(keep)
        self.hidden, self.tokens = self.hidden[keep], self.tokens[keep]
        self.count, self.start_position = self.count[keep], self.start_position[keep]
        self.carried = [c[keep] for c in self.carried]
        self.carried_valid = [v[keep] for v in self.carried_valid]

    # -- the layers' inputs and outputs -------------------------------------------------------------------------

    def _inputs(self, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """`MtpLayerStep`'s input vectors: each slot's token embedding, then its feature."""
        embeds = self.embeddings(tokens.to(self.embeddings.weight.device)).to(features.device, features.dtype)
        return torch.cat([embeds, features], dim=-1)
