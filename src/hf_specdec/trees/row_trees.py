"""The draft trees of one verification step, one per row of the batch.

A static [`DraftTree`] is the same for every row and every step; a dynamic tree (see
[`hf_specdec.trees.dynamic`]) is grown per row from the drafter's own probabilities, so rows verify trees of
different shapes in the same forward. Verification needs the same facts either way, as batched tensors:

    parents     (B, N)          parent of every node (node 0 is the root, its parent -1)
    depths      (B, N)          depth of every node; its position id offset from the root
    ancestors   (B, N, N)       ancestors[b, i, j]: node j is node i or one of its ancestors (the attention mask)
    paths       (B, N, D+1)     the nodes from the root to every node, padded with -1 after it
    children    (B, N, C)       every node's children in the order they are tried, padded with -1
    real        (B, N)          False for padding: rows whose trees have fewer nodes than the widest row
                                are padded with nodes that no other node sees and that are never accepted

Nodes are numbered so that a parent comes before its children, and siblings in the order they are tried
(the heads' rank order; prompt lookup's grafted nodes after the heads' own). A static tree's tensors have a
batch dimension of one, expanded to the batch without copies.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RowTrees:
    """Per-row tree structure for one step (see the module's docstring for the tensors)."""

    parents: torch.Tensor
    depths: torch.Tensor
    ancestors: torch.Tensor
    paths: torch.Tensor
    children: torch.Tensor
    real: torch.Tensor

    @classmethod
    def from_parents(
        cls,
        parents: torch.Tensor,
        real: torch.Tensor | None = None,
        validate: bool = True,
        max_depth: int | None = None,
        max_children: int | None = None,
    ) -> RowTrees:
        """The structure of trees given by their parent pointers.

        Args:
            parents (`torch.LongTensor` of shape `(batch, nodes)`): `parents[b, 0] == -1` (the root) and every
                other node's parent has a smaller index; siblings in the order they are to be tried.
            real (`torch.BoolTensor` of shape `(batch, nodes)`, *optional*): False for padding nodes (children
                of the root that are never tried); all True by default.
            validate (`bool`): check the structure (each check waits for the device); the library's own
                builders, whose trees are valid by construction, skip it.
            max_depth, max_children (`int`, *optional*): bounds on any node's depth and number of children that
                the caller knows (a tree grown depth by depth, with at most so many children per node): the
                structure is then built without the host reading a device value (`paths` and `children` are as
                wide as the bounds). Without them the exact sizes are read.
        """
        if parents.dim() != 2 or parents.shape[1] == 0:
            raise ValueError(f"Parents form a (batch, nodes) tensor, root first; got shape {tuple(parents.shape)}.")
        batch, n = parents.shape
        device = parents.device
        real = torch.ones(batch, n, dtype=torch.bool, device=device) if real is None else real.to(device)
        if validate:
            _validate(parents, real)
        nodes = torch.arange(n, device=device)
        if max_depth is not None:  # bounds known: a few matrix products, nothing read back
            ancestors, depths, paths = _structure_within(parents, max(max_depth, 1 if n > 1 else 0))
        else:
            ancestors, depths, paths = _structure_read(parents)
        # A node's place among its siblings: how many earlier real nodes share its parent.
        earlier = torch.ones(n, n, dtype=torch.bool, device=device).tril(-1)  # (N, N): j < i
        rank = ((parents[:, :, None] == parents[:, None, :]) & earlier & real[:, None, :]).sum(-1)  # (B, N)
        listed = real.clone()
        listed[:, 0] = False  # (B, N) nodes that are someone's child
        if max_children is not None:
            width = max(min(max_children, n - 1), 1)
        else:
            width = int(torch.where(listed, rank, 0).max()) + 1 if n > 1 else 1
        # Each listed node at (its parent, its rank); everything else into one spare slot, dropped.
        spare = n * width
        slot = torch.where(listed & (rank < width), parents.clamp_min(0) * width + rank, spare)
        flat = torch.full((batch, spare + 1), -1, dtype=torch.long, device=device)
        flat.scatter_(1, slot, torch.where(listed, nodes, -1).expand(batch, n).contiguous())
        children = flat[:, :spare].reshape(batch, n, width)
        return cls(parents, depths, ancestors, paths, children, real)

    @classmethod
    def chain(cls, num_nodes: int, device: torch.device | str = "cpu", batch: int = 1) -> RowTrees:
        """A chain of `num_nodes` nodes (the root, then one drafted token after another) for `batch` rows (views
        of one row, see [`expand`]); one per size, device and batch, shared (its tensors are never written to)."""
        return _chain(num_nodes, torch.device(device), batch)

    @classmethod
    def _build_chain(cls, num_nodes: int, device: torch.device) -> RowTrees:
        nodes = torch.arange(num_nodes, device=device)
        paths = torch.where(nodes[None, :] <= nodes[:, None], nodes[None, :], -1)  # (N, N): node i's path
        children = torch.where(nodes + 1 < num_nodes, nodes + 1, -1)[:, None]  # (N, 1)
        ancestors = torch.ones(num_nodes, num_nodes, dtype=torch.bool, device=device).tril()
        real = torch.ones(num_nodes, dtype=torch.bool, device=device)
        chain = cls(nodes[None] - 1, nodes[None], ancestors[None], paths[None], children[None], real[None])
        chain.__dict__["host_depths"] = [list(range(num_nodes))]  # node i at depth i: nothing to read
        return chain

    def expand(self, batch: int) -> RowTrees:
        """The same trees for `batch` rows, as views (for a structure built with one row)."""
        trees = RowTrees(*(t.expand(batch, *t.shape[1:]) for t in self._tensors()))
        trees.__dict__["_template"] = self  # whose host depths, once read, serve every expansion
        return trees

    @functools.cached_property
    def host_depths(self) -> list[list[int]]:
        """`depths` as host values, one list per row: read from the device once per tree (a static tree's
        expansions share one read; a chain's are known without one)."""
        template: RowTrees | None = self.__dict__.get("_template")
        if template is not None:
            return template.host_depths * self.depths.shape[0]
        return self.depths.tolist()

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return self.parents, self.depths, self.ancestors, self.paths, self.children, self.real

    @property
    def num_nodes(self) -> int:
        """Nodes per row, the root included: the tokens one verification forward feeds per row."""
        return self.parents.shape[1]

    @property
    def depth(self) -> int:
        """The deepest node's depth over all rows (the most drafted tokens a step can accept)."""
        return self.paths.shape[2] - 1

    @property
    def row_depths(self) -> torch.Tensor:
        """`(batch,)` each row's deepest node."""
        return self.depths.max(dim=1).values

    @property
    def leaves(self) -> torch.Tensor:
        """`(batch, nodes)` whether each node is a real node without children."""
        return (self.children[..., 0] < 0) & self.real

    def path_to(self, node: torch.Tensor) -> torch.Tensor:
        """`(batch, D+1)` the nodes from the root to `node` `(batch,)`, padded with -1."""
        paths = self.paths
        return paths.gather(1, node[:, None, None].expand(-1, 1, paths.shape[2])).squeeze(1)


def _structure_within(parents: torch.Tensor, max_depth: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(ancestors, depths, paths)` of trees no deeper than `max_depth`: the ancestor relation is the reflexive
    transitive closure of the parent relation, found by squaring it (`ceil(log2(max_depth + 1))` products); a
    node's ancestor at depth d is the one ancestor whose own depth is d. The products count at most `nodes` ones
    in float32: exact."""
    n = parents.shape[1]
    device = parents.device
    nodes = torch.arange(n, device=device)
    eye = torch.eye(n, dtype=torch.bool, device=device)
    reach = (parents[..., None] == nodes) | eye  # (B, N, N): itself or its parent
    span = 1  # path lengths `reach` covers
    while span < max_depth:
        reach = reach | (torch.bmm(reach.float(), reach.float()) > 0)
        span *= 2
    depths = reach.sum(dim=-1) - 1  # (B, N) ancestors other than itself
    levels = torch.arange(max_depth + 1, device=device)
    at_depth = (depths[..., None] == levels).to(torch.float32)  # (B, N, D+1): each node's depth, one-hot
    reached = reach.float()
    found = torch.bmm(reached, at_depth) > 0  # (B, N, D+1): n has an ancestor at depth d
    which = torch.bmm(reached, at_depth * nodes[None, :, None].float())  # that ancestor's index
    paths = torch.where(found, which.round().long(), -1)
    return reach, depths, paths


def _structure_read(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(ancestors, depths, paths)` of trees of unknown depth, walking up one level per pass (each pass reads
    whether any node has further to go)."""
    batch, n = parents.shape
    device = parents.device
    nodes = torch.arange(n, device=device)
    ancestors = torch.eye(n, dtype=torch.bool, device=device).repeat(batch, 1, 1)  # (B, N, N)
    depths = torch.zeros(batch, n, dtype=torch.long, device=device)
    walk = parents.clone()  # every node's ancestor one level further up at each pass
    while bool((walk >= 0).any()):
        up = walk >= 0
        ancestors |= (walk[..., None] == nodes) & up[..., None]
        depths += up.long()
        walk = torch.where(up, parents.gather(1, walk.clamp_min(0)), -1)
    deepest = int(depths.max())
    paths = torch.full((batch, n, deepest + 1), -1, dtype=torch.long, device=device)
    for depth in range(deepest + 1):
        at_depth = ancestors & (depths[:, None, :] == depth)  # (B, N, N)
        paths[..., depth] = torch.where(at_depth.any(-1), at_depth.float().argmax(-1), -1)
    return ancestors, depths, paths


def _validate(parents: torch.Tensor, real: torch.Tensor) -> None:
    n = parents.shape[1]
    if bool((parents[:, 0] != -1).any()):
        raise ValueError("Node 0 of every tree is the root, with parent -1.")
    if n > 1 and bool(((parents[:, 1:] < 0) | (parents[:, 1:] >= torch.arange(1, n, device=parents.device))).any()):
        raise ValueError("Every node's parent must be a node with a smaller index.")
    if not bool(real[:, 0].all()) or bool((~real & (parents > 0)).any()):
        raise ValueError("Padding nodes hang from the root, and the root is real.")
    if bool((real & ~real.gather(1, parents.clamp_min(0))).any()):
        raise ValueError("A padding node cannot have children.")


@functools.lru_cache(maxsize=256)
def _chain(num_nodes: int, device: torch.device, batch: int) -> RowTrees:
    chain = RowTrees._build_chain(num_nodes, device)
    return chain if batch == 1 else chain.expand(batch)
