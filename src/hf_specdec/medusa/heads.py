"""Draft heads on the base's last hidden state: what every kind shares (the draft vocabulary and the output
projection), and Medusa's K independent heads."""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.nn import functional

from hf_specdec.drafters.vocab import VocabularyRows, check_token_ids, vocab_index
from hf_specdec.trees.dynamic import Expander
from hf_specdec.trees.static import DraftTree


class ResBlock(nn.Module):
    """`x + SiLU(W x + b)`, with W initialised to zero so that a fresh head starts as the identity
    (then its projection, initialised from the base's lm_head, predicts what the base predicts)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden + nn.functional.silu(self.linear(hidden))


class DraftHeads(nn.Module):
    """What every kind of draft head shares: a depth (how many tokens past the base's next one it guesses),
    the vocabulary it proposes from and the projection onto it.

    With `token_ids`, the heads propose only those tokens (a *draft vocabulary*, see `hf_specdec.drafters.vocab`):
    they project onto those rows of the vocabulary and their logits have `len(token_ids)` entries. On a
    large vocabulary this makes the heads several times cheaper, and it stays lossless (the base verifies).

    Subclasses define `num_heads` and `max_dynamic_depth`, [`depth_logits`] (training), and for decoding
    [`tree_candidates`] (static trees) and [`expander`] (dynamic trees).

    Args:
        hidden_size (`int`): the base's hidden size.
        vocab_size (`int`): the base's number of logits.
        num_projections (`int`): own vocabulary projections (initialised from the base's lm_head); 0 to use
            the base's `lm_head` (passed to every call) instead.
        token_ids (`torch.LongTensor`, *optional*): the draft vocabulary; all `vocab_size` ids when `None`.
    """

    def __init__(
        self, hidden_size: int, vocab_size: int, num_projections: int, token_ids: torch.Tensor | None = None
    ) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        outputs = vocab_size
        if token_ids is not None:
            token_ids = check_token_ids(token_ids, vocab_size, "The heads' vocabulary")
            self.register_buffer("token_ids", token_ids)
            self.register_buffer("_index", vocab_index(token_ids, vocab_size), persistent=False)
            self.register_load_state_dict_post_hook(_reindex_after_load)
            outputs = token_ids.numel()
        else:
            self.token_ids = None
        self.projections = (
            nn.ModuleList(nn.Linear(hidden_size, outputs, bias=False) for _ in range(num_projections))
            if num_projections
            else None
        )
        self._shared_rows = VocabularyRows()  # the base lm_head's rows for `token_ids`, gathered once

    @property
    def num_heads(self) -> int:
        """How many tokens past the base's next one the heads guess (the deepest tree they fill)."""
        raise NotImplementedError

    def _reindex(self) -> None:
        """Rebuild the id-to-position map after the draft vocabulary was loaded."""
        assert self.token_ids is not None
        if not torch.equal(
            check_token_ids(self.token_ids, self.vocab_size, "The heads' vocabulary"), self.token_ids.long()
        ):
            raise ValueError("A heads' vocabulary must hold increasing token ids (their projections' row order).")
        self._index = vocab_index(self.token_ids, self.vocab_size).to(self.token_ids.device)

    @property
    def head_vocab_size(self) -> int:
        """How many tokens a head chooses from (its logits' last dimension)."""
        return self.vocab_size if self.token_ids is None else self.token_ids.numel()

    @property
    def dtype(self) -> torch.dtype:
        """The heads' own dtype (float32 for heads without weights: no blocks and the base's lm_head)."""
        parameter = next(self.parameters(), None)
        return torch.get_default_dtype() if parameter is None else parameter.dtype

    def init_projections_from(self, lm_head: nn.Module) -> None:
        """Copy the base's lm_head weights (the draft vocabulary's rows) into every own projection (Medusa's
        initialisation)."""
        if self.projections is None:
            return
        with torch.no_grad():
            weight = (
                lm_head.weight if self.token_ids is None else lm_head.weight[self.token_ids.to(lm_head.weight.device)]
            )
            for projection in self.projections:
                projection.weight.copy_(weight)

    def to_token_ids(self, indices: torch.Tensor) -> torch.Tensor:
        """Token ids of positions in the heads' logits."""
        return indices if self.token_ids is None else self.token_ids[indices]

    def to_head_index(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Positions of token ids in the heads' logits; -1 for ids outside the draft vocabulary (negative ids,
        i.e. ignored labels, stay -1 too)."""
        if self.token_ids is None:
            return token_ids.clamp_min(-1)
        return torch.where(token_ids >= 0, self._index[token_ids.clamp_min(0)], -1)

    def project(self, state: torch.Tensor, lm_head: nn.Module, projection: int = 0) -> torch.Tensor:
        """Logits `(..., head_vocab_size)` of states `(..., hidden)`: with own projection number `projection`,
        or with the base's `lm_head` (the draft vocabulary's rows)."""
        if self.projections is not None:
            layer = self.projections[projection]
            return layer(state.to(layer.weight.dtype))  # a head without blocks passes the base's state as it is
        if self.token_ids is None and lm_head.weight.dtype == state.dtype:
            return lm_head(state)  # the module itself, with any hooks (device placement, sharding)
        weight, bias = self._shared_rows(lm_head, self.token_ids, state.dtype)
        return functional.linear(state.to(weight.device), weight, bias).to(state.device)

    @property
    def reads_base_lm_head(self) -> bool:
        """Whether the heads project with the base's lm_head (its rows are then part of a head forward's cost)."""
        return self.projections is None

    @property
    def reads_tokens(self) -> bool:
        """Whether a depth's guess reads the tokens drafted before it (then it can be taught on any text, its
        inputs being that text's tokens; heads that do not must learn on the base's own path only)."""
        return False

    @property
    def attends(self) -> bool:
        """Whether the heads read whole sequences of the base's features (EAGLE-style heads, with attention and a
        cache of their own) rather than one position's hidden state."""
        return False

    def base_logits(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """The base's own logits `(..., head_vocab_size)` over the draft vocabulary, from its last hidden states:
        the distribution its heads learn with soft targets, whatever their own projections."""
        if self.token_ids is None:
            return lm_head(hidden.to(lm_head.weight.dtype))  # no copy of a whole vocabulary's rows
        weight, bias = self._shared_rows(lm_head, self.token_ids, hidden.dtype)
        return functional.linear(hidden.to(weight.device), weight, bias).to(hidden.device)

    def depth_logits(
        self,
        hidden: torch.Tensor,
        tokens: torch.Tensor,
        lm_head: nn.Module,
        embeddings: nn.Module | None,
        depth: int | None = None,
    ) -> list[torch.Tensor]:
        """Teacher-forced logits at depths 1..`depth` (default: all), for training and evaluation.

        Args:
            hidden (`torch.Tensor` of shape `(M, hidden)`): the base's last hidden state at M positions t.
            tokens (`torch.LongTensor` of shape `(M, depth)`): the tokens after each position, `tokens[:, i]`
                being token t + 1 + i (the base's next token first); heads that read drafted tokens take them
                from here, the others ignore them.
            lm_head, embeddings: the base's output projection and input embeddings.

        Returns:
            `depth` tensors of shape `(M, head_vocab_size)`; the i-th (from 0) predicts token t + 2 + i.
        """
        raise NotImplementedError

    def tree_candidates(
        self, hidden: torch.Tensor, root: torch.Tensor, tree: DraftTree, lm_head: nn.Module, embeddings: nn.Module
    ) -> torch.Tensor:
        """The token of every tree node `(batch, nodes)`: the root is the base's next token, a node of rank r
        holds the heads' rank-r candidate after its parent.

        Args:
            hidden (`torch.Tensor` of shape `(batch, hidden)`): the base's last hidden state, the one that
                chose `root`.
            root (`torch.LongTensor` of shape `(batch,)`): the base's next token, the tree's root.
            tree (`DraftTree`): no deeper than `num_heads`.
            lm_head, embeddings: the base's output projection and input embeddings.
        """
        raise NotImplementedError

    @property
    def max_dynamic_depth(self) -> int | None:
        """The deepest dynamic tree the heads can grow (`None`: no limit)."""
        raise NotImplementedError

    def expander(self, hidden: torch.Tensor, lm_head: nn.Module, embeddings: nn.Module) -> Expander:
        """The next-token log-probabilities after a frontier of nodes, depth by depth, for growing a
        [`DynamicTree`] from the base's last hidden state `hidden` `(batch, hidden)` (see `Expander`)."""
        raise NotImplementedError


class MedusaHeads(DraftHeads):
    """Medusa's heads (Cai et al. 2023): K independent networks, head k guessing token t + 2 + k from the
    base's hidden state at t alone. Each is its own stack of `ResBlock`s (independent weights: building the
    stack with `[ResBlock(h)] * n` would share one block's weights across layers) and a vocabulary
    projection, either its own or the base's `lm_head`.

    Args:
        num_heads (`int`): K.
        num_layers (`int`): residual blocks per head.
        hidden_size (`int`): the base's hidden size.
        vocab_size (`int`): the base's number of logits.
        share_lm_head (`bool`): use the base's `lm_head` (passed to `forward`) instead of own projections.
        token_ids (`torch.LongTensor`, *optional*): the draft vocabulary; all `vocab_size` ids when `None`.
    """

    def __init__(
        self,
        num_heads: int,
        num_layers: int,
        hidden_size: int,
        vocab_size: int,
        share_lm_head: bool,
        token_ids: torch.Tensor | None = None,
    ) -> None:
        super().__init__(hidden_size, vocab_size, 0 if share_lm_head else num_heads, token_ids)
        self.blocks = nn.ModuleList(
            nn.Sequential(*(ResBlock(hidden_size) for _ in range(num_layers))) for _ in range(num_heads)
        )

    @property
    def num_heads(self) -> int:
        return len(self.blocks)

    def head(self, k: int, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """Logits `(..., head_vocab_size)` of head `k` on hidden states `(..., hidden)`, in the heads' dtype (they
        may keep their own, e.g. float32 ones trained on a bfloat16 base)."""
        block = self.blocks[k]
        parameter = next(block.parameters(), None)
        state = block(hidden if parameter is None else hidden.to(parameter.dtype))
        return self.project(state, lm_head, k)

    def forward(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """Logits of every head.

        Args:
            hidden (`torch.Tensor` of shape `(batch, seq, hidden)`): the base's last hidden states (after its
                final norm, as its lm_head sees them).
            lm_head (`nn.Module`): the base's output projection, used when the heads share it.

        Returns:
            `torch.Tensor` of shape `(num_heads, batch, seq, head_vocab_size)`.
        """
        return torch.stack([self.head(k, hidden, lm_head) for k in range(self.num_heads)], dim=0)

    def depth_logits(
        self,
        hidden: torch.Tensor,
        tokens: torch.Tensor,
        lm_head: nn.Module,
        embeddings: nn.Module | None,
        depth: int | None = None,
    ) -> list[torch.Tensor]:
        return [self.head(k, hidden, lm_head) for k in range(self.num_heads if depth is None else depth)]

    def tree_candidates(
        self, hidden: torch.Tensor, root: torch.Tensor, tree: DraftTree, lm_head: nn.Module, embeddings: nn.Module
    ) -> torch.Tensor:
        # Every head's top candidates, whatever the parent: one projection per depth for the whole tree.
        top_k = max(tree.top_k_per_depth())
        logits = torch.stack([self.head(k, hidden, lm_head) for k in range(tree.depth)]).float()  # (D, B, V)
        candidates = self.to_token_ids(logits.topk(top_k, dim=-1).indices)  # (D, B, top_k)
        depths, ranks = _candidate_index(tree, root.device)
        return torch.cat([root[:, None], candidates[depths, :, ranks].T], dim=1)

    @property
    def max_dynamic_depth(self) -> int | None:
        return self.num_heads

    def expander(self, hidden: torch.Tensor, lm_head: nn.Module, embeddings: nn.Module) -> Expander:
        # Head d's guess does not depend on the path above it: the same candidates under every node of a
        # depth, only their scores differ.
        depth = 0

        def expand(tokens: torch.Tensor, parent_slot: torch.Tensor | None) -> torch.Tensor:
            nonlocal depth
            logp = torch.log_softmax(self.head(depth, hidden, lm_head).float(), dim=-1)  # (B, V)
            depth += 1
            return logp[:, None].expand(-1, tokens.shape[1], -1)

        return expand


def _reindex_after_load(module: nn.Module, _incompatible: object) -> None:
    """`load_state_dict` post hook: the loaded draft vocabulary needs its id-to-position map."""
    assert isinstance(module, DraftHeads)
    module._reindex()


@functools.lru_cache(maxsize=32)
def _candidate_index(tree: DraftTree, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Each non-root node's head (its depth less one) and candidate rank, on `device`: copied there once per tree
    and device, since a copy to a GPU at every step would make the host wait for the device."""
    return (tree.depths[1:] - 1).to(device), tree.ranks[1:].to(device)
