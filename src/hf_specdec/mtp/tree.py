"""A model's first multi-token-prediction (MTP) layer as a feature head that grows trees: EAGLE's recipe
(`hf_specdec.medusa.eagle_drafter.EagleDrafter`) with the MTP layer as the head.

MTP layer 0 reads what an EAGLE head reads (the target's last hidden state at a slot and the token after it) and
outputs a feature the target's lm_head turns into the next token's logits. Fed its own output as the next
slot's feature, it drafts past its trained depth, one forward per tree depth: the tree grows as far as it pays
(`tree_growth.grow_tree`), and its first depth holds the layer's own MTP drafts. Each child is a point mass for
verification, so greedy decoding keeps plain greedy's tokens and sampling keeps the target's distribution.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn
from transformers.modeling_layers import MtpModel

from hf_specdec.mtp.layers import MtpLayerStep, mtp_logits
from hf_specdec.trees.dynamic import DynamicTree

#: How deep a tree grows by default (at most; adaptive growth stops where a depth does not pay).
DEFAULT_TREE_DEPTH = 4
#: Children per frontier node by default, and the default number of verified nodes.
DEFAULT_TOP_K = 4
DEFAULT_NUM_NODES = 16


def mtp_tree(tree: DynamicTree | int) -> DynamicTree:
    """The tree MTP layer 0 grows: a `DynamicTree` (depth `DEFAULT_TREE_DEPTH` when unset) or a number of
    nodes (the default shape)."""
    if isinstance(tree, DynamicTree):
        return tree if tree.depth is not None else DynamicTree(tree.num_nodes, DEFAULT_TREE_DEPTH, tree.top_k)
    if isinstance(tree, int) and not isinstance(tree, bool) and tree >= 1:
        return DynamicTree.at_most(tree, DEFAULT_TREE_DEPTH, DEFAULT_TOP_K)
    raise ValueError(f"An MTP tree is a DynamicTree or a positive number of nodes, not {tree!r}.")


class MtpFeatureHead:
    """MTP layer 0 of `mtp` (its own modules, not copies) in the shape `EagleDrafter` drives.

    Args:
        mtp (`MtpModel`): the target's MTP layers (sharing its embeddings and lm_head).
        vocab_size (`int`): the target's number of logits.
    """

    def __init__(self, mtp: MtpModel, vocab_size: int) -> None:
        self.decoder = MtpLayerStep(mtp, 0)
        self.mtp = mtp
        self.vocab_size = vocab_size

    def parameters(self) -> Iterator[nn.Parameter]:
        """The layer's weights (where it runs)."""
        return self.decoder.parameters()

    #: What the layer reads: the target's last hidden state, as it is (`from_target`).
    feature_layers = (-1,)

    def from_target(self, states: torch.Tensor) -> torch.Tensor:
        return states

    def inputs(self, features: torch.Tensor, tokens: torch.Tensor, embeddings: nn.Module) -> torch.Tensor:
        """The layer's input vectors `(..., 2H)` for features `(..., H)` and the tokens after them: the MTP
        layers' own token embeddings (`embeddings`, the target's, may add a norm they skip), then the feature."""
        mtp = self.mtp
        embedded = mtp.embed_tokens(tokens.to(mtp.embed_tokens.weight.device))
        dtype = self.decoder.dtype
        return torch.cat([embedded.to(features.device, dtype), features.to(dtype)], dim=-1)

    def project(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """Logits over the target's vocabulary for the layer's features (through the shared lm_head)."""
        return mtp_logits(self.mtp, hidden, self.vocab_size)

    def to_token_ids(self, indices: torch.Tensor) -> torch.Tensor:
        """Token ids of positions in the logits: the same (the whole vocabulary)."""
        return indices
