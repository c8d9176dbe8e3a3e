"""Kept for imports only: the tree acceptance rules live in [`hf_specdec.acceptance`]."""

from hf_specdec.acceptance import greedy_accept_tree, sample_accept_tree, typical_accept_tree

__all__ = ["greedy_accept_tree", "sample_accept_tree", "typical_accept_tree"]
