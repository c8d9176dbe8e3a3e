"""Recurrent draft heads: one small network that reads the tokens it drafted, in the manner of Apple's
ReDrafter (Cheng et al. 2024) and Hydra's sequentially dependent heads (Ankner et al. 2024).

Medusa's head k guesses token t + 2 + k from the hidden state at t alone, blind to the k tokens before
it; by the third head it is mostly guessing. Here a state starts at the base's hidden state and advances
one token at a time:

    s_0 = h_t
    s_i = s_{i-1} + SiLU(A n(s_{i-1}) + B n(e(x_{t+i})) + b)    e: the base's input embeddings (frozen)
    logits_i = W ResBlocks(s_i)                                 W: the base's lm_head, or an own projection

where n scales a vector to unit root mean square: a model's embeddings are orders of magnitude smaller
than its hidden states (Qwen2.5-1.5B: 0.017 against 4.3), and unscaled, the token would barely move the
state.

so depth i is conditioned on every token of the path above it, which is exactly what tree verification
asks of it (a node matters only when its whole path is right). One set of weights serves every depth:
each labelled position teaches all of them, so the heads learn more from the same data. In a tree, every
node's children are its own state's top candidates; the state advances once per depth for the nodes that
have children.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from hf_specdec.medusa.heads import DraftHeads, ResBlock
from hf_specdec.medusa.labels import values_after
from hf_specdec.trees.dynamic import Expander
from hf_specdec.trees.static import DraftTree


class RecurrentHeads(DraftHeads):
    """A recurrent drafter on the base's last hidden state (see the module's docstring).

    Args:
        num_heads (`int`): the depth it drafts to (one set of weights for every depth).
        num_layers (`int`): residual blocks between the state and the vocabulary projection.
        hidden_size (`int`): the base's hidden size.
        vocab_size (`int`): the base's number of logits.
        share_lm_head (`bool`): use the base's `lm_head` instead of an own projection.
        embedding_size (`int`): the width of the base's input embeddings (its hidden size for most models).
        token_ids (`torch.LongTensor`, *optional*): the draft vocabulary; all `vocab_size` ids when `None`.
    """

    def __init__(
        self,
        num_heads: int,
        num_layers: int,
        hidden_size: int,
        vocab_size: int,
        share_lm_head: bool,
        embedding_size: int,
        token_ids: torch.Tensor | None = None,
    ) -> None:
        super().__init__(hidden_size, vocab_size, 0 if share_lm_head else 1, token_ids)
        self.depth = num_heads
        # Zero-initialised: a fresh drafter's state stays h_t, so every depth starts out as the base's guess.
        self.state_in = nn.Linear(hidden_size, hidden_size)
        self.token_in = nn.Linear(embedding_size, hidden_size, bias=False)
        nn.init.zeros_(self.state_in.weight)
        nn.init.zeros_(self.state_in.bias)
        nn.init.zeros_(self.token_in.weight)
        self.blocks = nn.Sequential(*(ResBlock(hidden_size) for _ in range(num_layers)))

    @property
    def num_heads(self) -> int:
        return self.depth

    @property
    def reads_tokens(self) -> bool:
        return True

    def step(self, state: torch.Tensor, tokens: torch.Tensor, embeddings: nn.Module) -> torch.Tensor:
        """The state after reading `tokens`: `state` `(..., hidden)`, `tokens` `(...)`."""
        embedded = embeddings(tokens.to(embeddings.weight.device)).to(device=state.device, dtype=state.dtype)
        update = self.state_in(_unit_rms(state)) + self.token_in(_unit_rms(embedded))
        return state + nn.functional.silu(update)

    def logits(self, state: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """Logits `(..., head_vocab_size)` of the next token after a state."""
        return self.project(self.blocks(state), lm_head)

    def depth_logits(
        self,
        hidden: torch.Tensor,
        tokens: torch.Tensor,
        lm_head: nn.Module,
        embeddings: nn.Module | None,
        depth: int | None = None,
    ) -> list[torch.Tensor]:
        if embeddings is None:
            raise ValueError("Recurrent heads read the drafted tokens: pass the base's input embeddings.")
        depth = self.depth if depth is None else depth
        if tokens.shape[-1] < depth:
            raise ValueError(f"Teacher forcing {depth} depths needs {depth} following tokens, got {tokens.shape[-1]}.")
        state = hidden.to(self.dtype)
        logits = []
        for i in range(depth):
            state = self.step(state, tokens[..., i], embeddings)
            logits.append(self.logits(state, lm_head))
        return logits

    def forward(
        self, hidden: torch.Tensor, lm_head: nn.Module, tokens: torch.Tensor, embeddings: nn.Module
    ) -> torch.Tensor:
        """Teacher-forced logits at every position of sequences.

        Args:
            hidden (`torch.Tensor` of shape `(batch, seq, hidden)`): the base's last hidden states.
            lm_head, embeddings: the base's output projection and input embeddings.
            tokens (`torch.LongTensor` of shape `(batch, seq)`): the sequences; depth i (from 0) at position t
                reads tokens t + 1 .. t + 1 + i (padding past the end, where there is no label anyway).

        Returns:
            `torch.Tensor` of shape `(num_heads, batch, seq, head_vocab_size)`; entry (i, b, t) predicts token
            t + 2 + i, as Medusa's head i does.
        """
        following = values_after(tokens, self.depth, 0)  # (B, T, depth)
        return torch.stack(self.depth_logits(hidden, following, lm_head, embeddings))

    def tree_candidates(
        self, hidden: torch.Tensor, root: torch.Tensor, tree: DraftTree, lm_head: nn.Module, embeddings: nn.Module
    ) -> torch.Tensor:
        batch = root.shape[0]
        nodes = root.new_zeros(batch, tree.num_nodes)
        nodes[:, 0] = root
        states = hidden.new_empty(batch, tree.num_nodes, hidden.shape[-1], dtype=self.dtype)
        parent_states = hidden.to(self.dtype)[:, None]  # the state before the root: h_t
        for level in _expansion_plan(tree, root.device):
            if level.grandparents is not None:
                parent_states = states[:, level.grandparents]
            expanded = self.step(parent_states, nodes[:, level.parents], embeddings)  # (B, P, H)
            states[:, level.parents] = expanded
            top = self.logits(expanded, lm_head).topk(level.top_k, dim=-1).indices  # (B, P, k)
            nodes[:, level.children] = self.to_token_ids(top[:, level.slots, level.ranks])  # (B, C)
        return nodes

    @property
    def max_dynamic_depth(self) -> int | None:
        return None  # the same step at every depth: it can draft past the depth it was trained to

    def expander(self, hidden: torch.Tensor, lm_head: nn.Module, embeddings: nn.Module) -> Expander:
        states = hidden.to(self.dtype)[:, None]  # (B, 1, H): the state before the root, h_t

        def expand(tokens: torch.Tensor, parent_slot: torch.Tensor | None) -> torch.Tensor:
            nonlocal states
            if parent_slot is not None:
                states = states.gather(1, parent_slot[..., None].expand(-1, -1, states.shape[-1]))  # (B, F, H)
            states = self.step(states, tokens, embeddings)  # each frontier node's own state
            return torch.log_softmax(self.logits(states, lm_head).float(), dim=-1)

        return expand


def _unit_rms(x: torch.Tensor) -> torch.Tensor:
    return nn.functional.rms_norm(x, (x.shape[-1],), eps=1e-6)


class _Level:
    """One depth of a tree's expansion: the nodes there that have children, and where their children go."""

    def __init__(
        self,
        parents: list[int],
        grandparents: list[int] | None,
        children: list[int],
        slots: list[int],
        ranks: list[int],
        device: torch.device,
    ) -> None:
        self.parents = torch.tensor(parents, device=device)  # nodes whose state advances at this depth
        self.grandparents = None if grandparents is None else torch.tensor(grandparents, device=device)
        self.children = torch.tensor(children, device=device)  # the nodes filled from them
        self.slots = torch.tensor(slots, device=device)  # each child's parent, as a position in `parents`
        self.ranks = torch.tensor(ranks, device=device)  # each child's candidate rank
        self.top_k = max(ranks) + 1


@functools.lru_cache(maxsize=32)
def _expansion_plan(tree: DraftTree, device: torch.device) -> tuple[_Level, ...]:
    """Depth by depth, which nodes expand and which children they fill (computed once per tree and device, so
    that decoding copies no index to the device at every step)."""
    parent_of = tree.parents.tolist()
    depth_of = tree.depths.tolist()
    rank_of = tree.ranks.tolist()
    levels = []
    for depth in range(tree.depth):
        parents = sorted({parent_of[n] for n in range(1, tree.num_nodes) if depth_of[n] == depth + 1})
        slot = {node: i for i, node in enumerate(parents)}
        children = [n for n in range(1, tree.num_nodes) if depth_of[n] == depth + 1]
        levels.append(
            _Level(
                parents,
                None if depth == 0 else [parent_of[p] for p in parents],
                children,
                [slot[parent_of[c]] for c in children],
                [rank_of[c] for c in children],
                device,
            )
        )
    return tuple(levels)
