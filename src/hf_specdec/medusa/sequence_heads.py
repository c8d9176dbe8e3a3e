"""What EAGLE-style heads share: a small decoder with its own attention and KV cache that reads the whole
sequence of the base's features, one token ahead of them, and drafts the next feature autoregressively.

Each kind says how a committed position's base states become the feature the decoder reads (`from_target`:
EAGLE-1's last hidden state as it is, EAGLE-3's fusion of three layers), how a token and a feature make the
decoder's input (`embed`, `combine`), and how a predicted feature becomes logits (`project`). Decoding
(`hf_specdec.medusa.eagle_drafter`) and training (`unroll`, the training-time test) are the same for every kind.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from hf_specdec.medusa.heads import DraftHeads
from hf_specdec.medusa.labels import values_after
from hf_specdec.trees.dynamic import Expander
from hf_specdec.trees.masks import chain_structure, to_additive
from hf_specdec.trees.static import DraftTree


class SequenceHeads(DraftHeads):
    """A drafter that reads the base's features over whole sequences (see the module's docstring).

    Subclasses set `decoder` (a transformers base model fed `inputs_embeds`) and `depth`, and define `embed`,
    `combine` and, when it is not the base's last hidden state as it is, `from_target` and `feature_layers`.
    """

    decoder: PreTrainedModel
    depth: int
    #: Whether training also regresses the predicted features on the base's next ones (EAGLE-1 and 2's loss).
    predicts_features = True

    @property
    def num_heads(self) -> int:
        return self.depth

    @property
    def reads_tokens(self) -> bool:
        return True

    @property
    def attends(self) -> bool:
        return True

    @property
    def max_dynamic_depth(self) -> int | None:
        return None  # the same step at every depth: it can draft past the depth it was trained to

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The base's hidden states the heads read, as indices of `output_hidden_states` (-1: the last, after the
        final norm); `from_target` takes them concatenated in this order."""
        return (-1,)

    @property
    def state_layers(self) -> tuple[int, ...]:
        """The base's hidden states training reads, concatenated in this order: those the heads fuse, then the last
        one (the base's own logits, the soft targets, and the features EAGLE-1 regresses on)."""
        return read_states(self.feature_layers)

    def split_states(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`states` `(..., len(state_layers) * hidden)` as (what the heads read, the base's last hidden state)."""
        if self.feature_layers == (-1,):
            return states, states
        last = states.shape[-1] // len(self.state_layers)
        return states[..., :-last], states[..., -last:]

    def from_target(self, states: torch.Tensor) -> torch.Tensor:
        """The feature `(..., hidden)` the decoder reads at a committed position, from the base's states there
        `(..., len(feature_layers) * base hidden)`."""
        return states.to(self.dtype)

    def embed(self, tokens: torch.Tensor, embeddings: nn.Module) -> torch.Tensor:
        """The token part of the decoder's input for `tokens` `(...)`, from the base's input `embeddings`."""
        raise NotImplementedError

    def combine(self, token_part: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """The decoder's input vectors for a token part (`embed`) and a feature (`from_target`, or the decoder's
        own prediction one position earlier)."""
        raise NotImplementedError

    def inputs(self, features: torch.Tensor, tokens: torch.Tensor, embeddings: nn.Module) -> torch.Tensor:
        """The decoder's inputs for features `(..., hidden)` and the tokens that follow them `(...)` (the token
        each feature chose, or a drafted one)."""
        return self.combine(self.embed(tokens.to(embeddings.weight.device), embeddings), features.to(self.dtype))

    def unroll(
        self,
        hidden: torch.Tensor,
        tokens: torch.Tensor,
        embeddings: nn.Module,
        attention_mask: torch.Tensor | None = None,
        depth: int | None = None,
        needed: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """The head's predicted features at every position and depth, as decoding would draft them (training and
        evaluation: the training-time test).

        Depth 0 reads the base's features; depth i reads the head's own predictions of depth i - 1, attending to
        the real features up to the position it drafts from and to its own earlier predictions along the chain,
        as the drafted nodes of a tree do. Depth 0 runs over every position (each one is context for the later
        depths); the later depths run only the chains that start at a `needed` position, so that training pays
        nothing past the first depth for prompt tokens and padding, which carry no label.

        Args:
            hidden (`torch.Tensor` of shape `(batch, seq, width)`): the base's states the heads read (see
                `feature_layers`).
            tokens (`torch.LongTensor` of shape `(batch, seq)`): the sequences the states were computed on.
            embeddings (`nn.Module`): the base's input embeddings.
            attention_mask (`torch.Tensor` of shape `(batch, seq)`, *optional*): 0 on padding.
            depth (`int`, *optional*): how many depths (default `num_heads`).
            needed (`torch.BoolTensor` of shape `(batch, seq)`, *optional*): the positions whose predictions are
                used (default: all of them).

        Returns:
            `depth` tensors `(batch, seq, hidden)`: entry (i, b, t) is the feature of position t + 1 + i the head
            predicts from the base's features up to t and the tokens t + 1 .. t + 1 + i; its logits predict token
            t + 2 + i, as Medusa's head i does (zeros where t + 1 + i is past the end, and at depths >= 1 where t is
            not `needed`).
        """
        depth = self.depth if depth is None else depth
        batch, length, _ = hidden.shape
        device = hidden.device
        valid = (
            torch.ones(batch, length, dtype=torch.bool, device=device)
            if attention_mask is None
            else attention_mask.bool()
        )
        following = values_after(tokens, 1, 0)[..., 0]  # (B, T) the token after each position
        token_part = self.embed(following.to(embeddings.weight.device), embeddings).to(device)
        cache = DynamicCache()
        out = self.decoder(
            inputs_embeds=self.combine(token_part, self.from_target(hidden)),
            attention_mask=to_additive(context_visibility(valid), self.dtype),
            position_ids=torch.arange(length, device=device).expand(batch, length),
            cache=cache,
            use_cache=True,
        ).last_hidden_state  # (B, T, H): entry t predicts the feature of t + 1 from the real features up to t
        predicted = [out]
        starts, slots = chain_starts(
            torch.ones_like(valid) if needed is None else needed.to(device=device, dtype=torch.bool)
        )  # (B, N): the chains that later depths extend, from their first position
        rows = torch.arange(batch, device=device)[:, None].expand_as(starts)
        features = out[rows, starts]  # (B, N, H): what the chain's depth 1 reads
        live = [slots]
        for step in range(1, depth):
            position = starts + step  # (B, N): the position each chain's entry of this depth stands for
            live.append(slots & (position < length))
            if not bool(live[-1].any()):
                predicted.append(torch.zeros_like(out))
                continue
            position = position.clamp_max(length - 1)
            mask = to_additive(unrolled_visibility(valid, starts, live), self.dtype)
            features = self.decoder(
                inputs_embeds=self.combine(token_part[rows, position], features),
                attention_mask=mask,
                position_ids=position,
                cache=cache,
                use_cache=True,
            ).last_hidden_state  # (B, N, H): each chain's prediction of the feature after `position`
            shown = live[-1]
            aligned = torch.zeros_like(out).index_put((rows[shown], starts[shown]), features[shown])
            predicted.append(aligned)  # on the chain's start, where its label is
        return predicted

    def depth_logits_on_sequences(
        self,
        hidden: torch.Tensor,
        tokens: torch.Tensor,
        lm_head: nn.Module,
        embeddings: nn.Module,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits `(num_heads, batch, seq, head_vocab_size)` of every depth at every position (see `unroll`)."""
        return torch.stack([self.project(f, lm_head) for f in self.unroll(hidden, tokens, embeddings, attention_mask)])

    def forward(
        self,
        hidden: torch.Tensor,
        lm_head: nn.Module,
        tokens: torch.Tensor,
        embeddings: nn.Module,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Teacher-forced logits at every position, as `depth_logits_on_sequences`."""
        return self.depth_logits_on_sequences(hidden, tokens, lm_head, embeddings, attention_mask)

    def depth_logits(
        self,
        hidden: torch.Tensor,
        tokens: torch.Tensor,
        lm_head: nn.Module,
        embeddings: nn.Module | None,
        depth: int | None = None,
    ) -> list[torch.Tensor]:
        raise TypeError("EAGLE heads read whole sequences: use `unroll` (hf_specdec.medusa.loss does).")

    def tree_candidates(
        self, hidden: torch.Tensor, root: torch.Tensor, tree: DraftTree, lm_head: nn.Module, embeddings: nn.Module
    ) -> torch.Tensor:
        raise ValueError(
            "EAGLE heads grow a tree per row and step (tree=<number of nodes>, 'dynamic' or a DynamicTree), not a "
            "static tree."
        )

    def expander(self, hidden: torch.Tensor, lm_head: nn.Module, embeddings: nn.Module) -> Expander:
        raise TypeError("EAGLE heads keep a cache across steps: they draft through EagleDrafter.")


def read_states(feature_layers: tuple[int, ...]) -> tuple[int, ...]:
    """The base's hidden states that heads fusing `feature_layers` train on: those layers, then the last one
    (`(-1,)` alone for heads that read the last one only)."""
    return feature_layers if feature_layers == (-1,) else (*feature_layers, -1)


def context_visibility(valid: torch.Tensor) -> torch.Tensor:
    """Which keys the queries of unrolled depth 0 see `(batch, seq, seq)`: the real positions up to their own,
    as the base's causal attention does. A padding query still sees itself, so attention never produces NaN."""
    length = valid.shape[1]
    causal = chain_structure(length, valid.device)
    return (causal[None] & valid[:, None, :]) | torch.eye(length, dtype=torch.bool, device=valid.device)[None]


def chain_starts(needed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The positions of each row's `needed` entries `(batch, seq)`, packed to the left `(batch, N)` (N the most
    any row has), and which of those slots are real `(batch, N)` (the others hold 0)."""
    counts = needed.sum(dim=1)
    width = int(counts.max()) if needed.numel() else 0
    order = torch.sort((~needed).to(torch.int8), dim=1, stable=True).indices[:, :width]  # needed ones first
    slots = torch.arange(width, device=needed.device)[None, :] < counts[:, None]
    return torch.where(slots, order, 0), slots


def unrolled_visibility(valid: torch.Tensor, starts: torch.Tensor, live: list[torch.Tensor]) -> torch.Tensor:
    """Which keys the chains' entries of unrolled depth `len(live) - 1` (>= 1) see `(batch, N, seq + depth * N)`,
    the keys being depth 0's entries (every position) and then each later depth's chain entries, in order.

    The chain starting at position `t` (`starts`, `(batch, N)`) drafts from the real features up to `t`: its
    entry of depth `step` sees those (depth 0, where `valid`) and, at every depth d in 1..`step`, its own entry
    (the one of d = `step` being itself), exactly as a tree node sees the committed cache and its ancestors.
    `live[d]` `(batch, N)` says which chains have an entry at depth d (the chain is not past the end); an entry
    that is not still sees itself, so attention never produces NaN."""
    step = len(live) - 1
    length, width = valid.shape[1], starts.shape[1]
    key = torch.arange(length, device=valid.device)
    context = (key[None, None, :] <= starts[:, :, None]) & valid[:, None, :]  # (B, N, T)
    own = torch.eye(width, dtype=torch.bool, device=valid.device)[None]  # (1, N, N)
    blocks = [context & live[step][:, :, None]]
    blocks += [own & live[d][:, None, :] for d in range(1, step)]
    blocks.append(own.expand(valid.shape[0], -1, -1))
    return torch.cat(blocks, dim=2)
