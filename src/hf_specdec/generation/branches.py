"""A tree verified on a model with recurrent layers: each root-to-leaf path a row of its own.

A recurrent layer (linear attention, a state space model, a short convolution) reads the tokens of a forward in
order, each from the state the token before it left: a tree's siblings, side by side in one forward, would each
read their elder sibling's state. So each row's tree is cut into its root-to-leaf paths, every path becomes a row
of the batch (the row's caches repeated for its paths), the paths are verified as chains in one forward, and each
node's scores are read off a path that holds it. After acceptance the row keeps the path that holds its accepted
node, and the batch goes back to one row per sequence (`CachedSequence.fork` and `join`).

What it costs over a chain: the row's attention cache is copied once per path, and a node shared by several paths
is computed once in each (a tree of L leaves and depth D feeds up to L * (D + 1) tokens a row, where the tree has
N nodes).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from hf_specdec.trees.row_trees import RowTrees


class Branches(NamedTuple):
    """Every row's tree as its root-to-leaf paths, `num_paths` per row (rows with fewer repeat their root alone).

    Attributes:
        num_paths (`int`): paths per row, L (the most leaves of any row).
        tokens (`torch.LongTensor` of shape `(batch * L, D + 1)`): each path's tokens, root first.
        valid (`torch.BoolTensor` of shape `(batch * L, D + 1)`): which of them are real (paths end early).
        positions (`torch.LongTensor` of shape `(batch * L, D + 1)`): their logical positions.
        node_path (`torch.LongTensor` of shape `(batch, N)`): a path (in `0..L-1`) holding each node.
        depths (`torch.LongTensor` of shape `(batch, N)`): each node's depth, its column in the path.
    """

    num_paths: int
    tokens: torch.Tensor
    valid: torch.Tensor
    positions: torch.Tensor
    node_path: torch.Tensor
    depths: torch.Tensor

    def node_states(self, states: torch.Tensor) -> torch.Tensor:
        """Per node `(batch, N, ...)`, from per path and column `(batch * L, D + 1, ...)`: each node's from a path
        that holds it."""
        batch, nodes = self.node_path.shape
        per_path = states.reshape(batch, self.num_paths * states.shape[1], *states.shape[2:])
        index = self.node_path * states.shape[1] + self.depths  # (B, N): flat (path, column)
        index = index.reshape(batch, nodes, *([1] * (states.dim() - 2))).expand(batch, nodes, *states.shape[2:])
        return per_path.gather(1, index)

    def kept_rows(self, last_node: torch.Tensor) -> torch.Tensor:
        """The path row `(batch,)` each row keeps: one that holds its last accepted node `(batch,)`."""
        batch = last_node.shape[0]
        path = self.node_path.gather(1, last_node[:, None]).squeeze(1)  # (B,)
        return torch.arange(batch, device=path.device) * self.num_paths + path


def branches(nodes: torch.Tensor, trees: RowTrees, next_position: torch.Tensor, last_position: int) -> Branches:
    """Every row's tree `(batch, N)` of `nodes` cut into its root-to-leaf paths (see `Branches`); `next_position`
    `(batch,)` is the first drafted node's position, none past `last_position`. Reads the most leaves of a row."""
    batch, num_nodes = nodes.shape
    leaves = trees.leaves  # (B, N)
    num_paths = max(int(leaves.sum(dim=1).max()), 1)
    order = torch.argsort((~leaves).to(torch.int8), dim=1, stable=True)[:, :num_paths]  # (B, L) leaves first
    has_leaf = leaves.gather(1, order)  # (B, L)
    columns = trees.paths.shape[2]
    paths = trees.paths.gather(1, order[..., None].expand(-1, -1, columns))  # (B, L, D+1) node ids, -1 after
    root_alone = torch.full_like(paths, -1)
    root_alone[..., 0] = 0
    paths = torch.where(has_leaf[..., None], paths, root_alone)
    valid = paths >= 0
    tokens = nodes.gather(1, paths.clamp_min(0).reshape(batch, -1)).reshape(batch, num_paths, columns)
    depth = torch.arange(columns, device=nodes.device)
    positions = (next_position[:, None, None] - 1 + depth).clamp_max(last_position).expand(-1, num_paths, -1)
    # The first path holding each node (every node is on the path of some leaf below it).
    holds = (paths[..., None] == torch.arange(num_nodes, device=nodes.device)).any(dim=2)  # (B, L, N)
    node_path = holds.int().argmax(dim=1)  # (B, N)
    return Branches(
        num_paths,
        tokens.reshape(batch * num_paths, columns),
        valid.reshape(batch * num_paths, columns),
        positions.reshape(batch * num_paths, columns).contiguous(),
        node_path,
        trees.depths.clamp_max(columns - 1),
    )
