"""EAGLE heads as a drafter: a tree per row and step, grown from the head's own features (EAGLE-2's dynamic
trees), with prompt lookup's continuation grafted on when asked.

The head's KV cache holds one entry per committed position t: the base's real feature f_t with the token that
followed it. Entries the head has not seen yet wait as *pending*: after the prompt, its last position (the
feature that chose the first token); after a step, every node of the accepted path (their features come from the
verification forward). A step feeds them in one forward; the last one's output predicts the feature at the
root, whose logits give the root's children. Each further depth feeds the frontier's nodes, each with its
parent's predicted feature, under a tree mask (a node sees the committed entries and its own ancestors). After
verification the drafted nodes' entries are dropped: the accepted ones come back with the base's real features.

Children are the head's top candidates (chosen from the context alone, not drawn), so verification treats each
as a point mass: greedy decoding keeps plain greedy's tokens and sampling keeps the target's distribution
exactly (`acceptance.sample_accept_tree`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import torch
from torch import nn

from hf_specdec.drafters.draft_tree import FrontierAncestry
from hf_specdec.drafters.lookup import PromptLookupDrafter
from hf_specdec.drafters.tree_growth import LookupWhileWaiting, graft_lookup, grow_tree
from hf_specdec.generation.decisions import CostModel
from hf_specdec.generation.drafter import Accepted, DraftingContext, Proposal, append_pending, committed_tokens
from hf_specdec.generation.kv_cache import CachedSequence
from hf_specdec.generation.sequences import TokenBuffer
from hf_specdec.trees.dynamic import DynamicTree
from hf_specdec.trees.masks import chain_structure


class FeatureHead(Protocol):
    """What `EagleDrafter` drives: EAGLE heads (`SequenceHeads`) or a model's own MTP layer
    (`hf_specdec.mtp.tree.MtpFeatureHead`)."""

    decoder: Any  # run through a `CachedSequence`: it keeps its own KV cache

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The base's hidden states it reads."""
        ...

    def parameters(self) -> Iterator[nn.Parameter]: ...

    def from_target(self, states: torch.Tensor) -> torch.Tensor: ...

    def inputs(self, features: torch.Tensor, tokens: torch.Tensor, embeddings: nn.Module) -> torch.Tensor: ...

    def project(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor: ...

    def to_token_ids(self, indices: torch.Tensor) -> torch.Tensor: ...


class EagleDrafter(LookupWhileWaiting):
    """Grows a tree per row with EAGLE heads (see the module's docstring).

    Args:
        context (`DraftingContext`): the loop's context (the base's lm_head and embeddings are read).
        heads (`FeatureHead`): the head (`SequenceHeads`; a model's own MTP layer drives the same way).
        tree (`DynamicTree`): the tree to grow, with its depth set.
        prompt_lookup (`PromptLookupDrafter`, *optional*): also graft each row's prompt-lookup continuation onto
            its tree, as far as the measured acceptance of its matches pays for verifying it.
        adaptive (`bool`): grow and verify the tree only as far as it pays (`tree_growth.grow_tree`); otherwise
            whole.
    """

    def __init__(
        self,
        context: DraftingContext,
        heads: FeatureHead,
        tree: DynamicTree,
        prompt_lookup: PromptLookupDrafter | None = None,
        adaptive: bool = True,
    ) -> None:
        if tree.depth is None:
            raise ValueError("EagleDrafter needs a DynamicTree with a depth (generate() sets the heads' own).")
        self.heads, self.tree, self.prompt_lookup, self.adaptive = heads, tree, prompt_lookup, adaptive
        # A chain (the top token at every depth), nothing grafted: every row's path is a prefix of its nodes.
        self.chain = tree.top_k == 1 and prompt_lookup is None
        self.hidden_state_layers = heads.feature_layers
        self.lm_head = context.target.get_output_embeddings()
        self.embeddings = context.target.get_input_embeddings()
        self.device = next(heads.parameters()).device
        self.reads = context.reads
        self.max_depth = max(tree.depth, prompt_lookup.num_tokens if prompt_lookup is not None else 0)
        self.seq: CachedSequence | None = None
        self._prompt: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        # Committed positions the head has not seen, left-aligned: the base's feature there, the token after it,
        # how many there are per row, and the first one's position (they are consecutive).
        self.features: torch.Tensor | None = None  # (A, W, H)
        self.tokens: torch.Tensor | None = None  # (A, W)
        self.count: torch.Tensor | None = None  # (A,)
        self.start_position: torch.Tensor | None = None  # (A,)
        self._fed = 0  # entries the current step appended to the head's cache
        self._pending_width = 0  # of which the pending ones, fed first
        self._grown = True  # whether this step grew a tree (else prompt lookup's chain alone, `propose_free`)

    def prefill(self, input_ids: torch.Tensor, valid: torch.Tensor, positions: torch.Tensor) -> None:
        """Keep the prompts: the head needs the base's features on them too (`start`)."""
        self._prompt = (input_ids, valid, positions)
        if self.prompt_lookup is not None:
            self.prompt_lookup.prefill(input_ids, valid, positions)

    def start(self, first_token: torch.Tensor, hidden: torch.Tensor | None) -> None:
        """Feed the head every prompt position but the last, with the token that follows it; the last one (the
        feature that chose `first_token`) stays pending. Continuing a cache, `hidden` covers the new columns only:
        the head's context starts there (at their logical positions), which can lower acceptance, not the output."""
        assert self._prompt is not None and hidden is not None
        input_ids, valid, positions = (t.to(self.device) for t in self._prompt)
        self._prompt = None
        following = torch.cat([input_ids[:, 1:], first_token[:, None].to(self.device)], dim=1)  # (B, P)
        cut = input_ids.shape[1] - hidden.shape[1]  # the cached columns, which have no hidden state
        input_ids, valid, positions, following = (t[:, cut:] for t in (input_ids, valid, positions, following))
        hidden = hidden.to(self.device)
        self.seq = CachedSequence(self.heads.decoder, input_ids.shape[0], self.device, self.reads)
        length = input_ids.shape[1]
        if length > 1:
            self.seq.forward(
                None,
                valid[:, :-1],
                positions[:, :-1],
                chain_structure(length - 1, self.device),
                inputs_embeds=self.heads.inputs(
                    self.heads.from_target(hidden[:, :-1]), following[:, :-1], self.embeddings
                ),
            )
        self.features, self.tokens = hidden[:, -1:], following[:, -1:]
        self.count = torch.ones_like(first_token, device=self.device)
        self.start_position = positions[:, -1].clone()

    def propose(
        self,
        buffer: TokenBuffer,
        last_token: torch.Tensor,
        next_position: torch.Tensor,
        costs: CostModel,
        max_tokens: int,
    ) -> Proposal:
        """Feed the pending entries, then grow each row's tree from its last token, no deeper than `max_tokens`
        (at least one)."""
        assert self.seq is not None and self.features is not None and self.tokens is not None
        assert self.count is not None and self.start_position is not None
        spec = self.tree.within(max_tokens)
        rows, width = self.tokens.shape
        offsets = torch.arange(width, device=self.device)
        last_position = buffer.max_length - 1
        out = self.seq.forward(
            None,
            offsets[None, :] < self.count[:, None],
            (self.start_position[:, None] + offsets[None, :]).clamp_max(last_position),
            chain_structure(width, self.device),
            inputs_embeds=self.heads.inputs(self.heads.from_target(self.features), self.tokens, self.embeddings),
        ).last_hidden_state  # (A, W, H)
        self._pending_width = self._fed = width
        root_position = self.start_position + self.count  # the root's logical position
        frontier = out.gather(1, (self.count - 1)[:, None, None].expand(-1, 1, out.shape[-1]))  # (A, 1, H)
        ancestry = FrontierAncestry(rows, self.device)
        target_device = last_token.device

        def expand(tokens: torch.Tensor, parent_slot: torch.Tensor | None) -> torch.Tensor:
            """Log-probabilities `(A, F, head vocab)` after every frontier node, from its predicted feature."""
            nonlocal frontier
            assert self.seq is not None
            if parent_slot is not None:  # feed the frontier: each node with its parent's predicted feature
                parent_slot = parent_slot.to(self.device)
                previous_width = frontier.shape[1]
                parents = frontier.gather(1, parent_slot[..., None].expand(-1, -1, frontier.shape[-1]))
                ancestry.advance(parent_slot, previous_width)
                positions = (root_position[:, None] + ancestry.depth - 1).clamp_max(last_position)
                width = tokens.shape[1]
                frontier = self.seq.forward(
                    None,
                    torch.ones(rows, width, dtype=torch.bool, device=self.device),
                    positions.expand(-1, width),
                    torch.eye(width, dtype=torch.bool, device=self.device),
                    recent=ancestry.recent,
                    inputs_embeds=self.heads.inputs(parents, tokens.to(self.device), self.embeddings),
                ).last_hidden_state
                self._fed += width
            logits = self.heads.project(frontier, self.lm_head).float()
            return torch.log_softmax(logits, dim=-1).to(target_device)

        adaptive = costs if self.adaptive else None
        grown = grow_tree(spec, last_token, expand, self.heads.to_token_ids, buffer, adaptive)
        nodes, trees, looked_up = graft_lookup(
            grown.nodes, grown.trees, self.prompt_lookup, buffer, next_position, costs, max_tokens
        )
        return Proposal(nodes, trees, forwards=grown.forwards, looked_up=looked_up, chain=self.chain)

    def propose_free(
        self,
        buffer: TokenBuffer,
        last_token: torch.Tensor,
        next_position: torch.Tensor,
        costs: CostModel,
        max_tokens: int,
    ) -> Proposal | None:
        """Prompt lookup's chain alone (`LookupWhileWaiting`). The head feeds nothing this step: the accepted path
        joins its pending entries (`commit`)."""
        proposal = super().propose_free(buffer, last_token, next_position, costs, max_tokens)
        self._grown = proposal is None
        return proposal

    def commit(self, accepted: Accepted) -> None:
        """Drop the drafted nodes' entries; the accepted path's nodes become pending, with the base's features.
        After a step that grew no tree (`propose_free`), the path's nodes join the pending entries."""
        if self.prompt_lookup is not None:
            self.prompt_lookup.observe(committed_tokens(accepted))
        if not self._grown:
            self._grown = True
            self._append(accepted)
            return
        assert self.seq is not None and self.count is not None and self.start_position is not None
        width = self._pending_width
        self.seq.keep_prefix(self._fed, torch.full_like(self.count, width), keep_max=width)
        self.seq.maybe_compact()
        assert accepted.hidden is not None
        self.start_position = self.start_position + self.count  # the root's position
        self.features = accepted.hidden.to(self.device)  # (A, D+1, H) at the path's nodes, the root first
        self.tokens = accepted.tokens.to(self.device)  # the token after each of them
        self.count = (accepted.num_accepted + 1).to(self.device)

    def follow(self, accepted: Accepted) -> None:
        """A plain step: the root's entry (its feature, the target's token after it) joins the pending ones."""
        self._append(accepted)

    def _append(self, accepted: Accepted) -> None:
        """The accepted path's entries (each node's feature, the token after it) join the pending ones."""
        assert self.features is not None and self.tokens is not None and self.count is not None
        most = accepted.path.shape[1] if accepted.outcome is None else accepted.outcome.max_accepted + 1
        self.features, self.tokens, self.count = append_pending(self.features, self.tokens, self.count, accepted, most)

    def select_rows(self, keep: torch.Tensor) -> None:
        assert self.seq is not None and self.features is not None and self.tokens is not None
        assert self.count is not None and self.start_position is not None
        keep = keep.to(self.device)
        self.seq.select_rows(keep)
        self.features, self.tokens = self.features[keep], self.tokens[keep]
        self.count, self.start_position = self.count[keep], self.start_position[keep]
        if self.prompt_lookup is not None:
            self.prompt_lookup.select_rows(keep)
