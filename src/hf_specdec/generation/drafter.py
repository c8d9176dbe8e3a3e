"""What the decoding loop asks of a drafter, whatever proposes the tokens: one protocol for chains and trees.

Every step a drafter proposes, for each active row, a tree of tokens rooted at the row's last committed token
(a chain is a tree of width one); the loop verifies every node in one target forward, accepts the deepest
node whose path the target agrees with, commits that path and tells the drafter what it kept.

Drafters: `DraftModelDrafter` (a smaller causal LM, `generate(assistant=...)`), `PromptLookupDrafter` (n-gram
matches in each row's own tokens), `HybridDrafter` (each step one of the two), `MedusaDrafter` (Medusa or
recurrent heads, static or dynamic trees, with prompt lookup grafted on), `EagleDrafter` (EAGLE heads, or a
model's own MTP layer, growing trees) and `MtpDrafter` (a model's own MTP layers, a chain).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple, Protocol, runtime_checkable

import torch
from transformers import GenerationConfig, PreTrainedModel

from hf_specdec.generation.decisions import CostModel
from hf_specdec.generation.processing import RaggedLogitsProcessor
from hf_specdec.generation.readback import HostReads, StepOutcome
from hf_specdec.generation.sequences import TokenBuffer
from hf_specdec.trees.row_trees import RowTrees


class Proposal(NamedTuple):
    """One step's drafts for every active row, as a tree per row.

    Attributes:
        nodes (`torch.LongTensor` of shape `(active, N)`): every node's token, node 0 the root (the row's last
            committed token, which the target scores first), then the drafted tokens, parents before children.
        trees (`RowTrees`): each row's tree over the `N` nodes (padding nodes are not `real`: never accepted).
        q (`torch.Tensor` of shape `(active, N, vocab)`, *optional*): when sampling, the distribution at each
            node from which a drafter drew its children (rows of nodes without children may be left off the
            end); `None` for greedy decoding and for drafters that propose with certainty (prompt lookup,
            Medusa heads, a draft model's trees: each child a point mass).
        drafted (`torch.LongTensor` of shape `(active,)` or `int`, *optional*): tokens drafted per row (or by every
            row), for the statistics (a chain's length); `None` for a tree: its depth, the most tokens a step can
            accept from it.
        forwards (`int`): draft-model forward passes the proposal took (0 for a lookup or heads).
        looked_up (`bool`): whether prompt lookup drafted any of it (for the statistics).
        catch_up (`bool`): whether the drafter first fed committed tokens it had not seen after plain or lookup
            steps (more than a step's usual one or two): that forward costs more than a draft forward, so the
            step's drafting time says nothing of what one costs (the cost model leaves `c` as it was).
        chain (`bool`): every row's tree is a chain numbered in order, so an accepted path is a prefix of the
            nodes (the loop then moves no cache slot and gathers no score).
        started (`bool`): the drafter first fed its draft model the prompts (its deferred prefill), or timed a
            draft forward before judging whether to: the step's time is no measure of what a step costs, and the
            cost model and the speculation gate leave it out.
        plain (`bool`): the drafter drafted nothing because drafting was not expected to pay (a draft model not
            worth starting): a plain step, counted as one.
    """

    nodes: torch.Tensor
    trees: RowTrees
    q: torch.Tensor | None = None
    drafted: torch.Tensor | int | None = None
    forwards: int = 0
    looked_up: bool = False
    catch_up: bool = False
    chain: bool = False
    started: bool = False
    plain: bool = False


class Accepted(NamedTuple):
    """What the loop committed in a step, per active row.

    Attributes:
        path (`torch.LongTensor` of shape `(active, D+1)`): the accepted nodes, root first, -1 after the last.
        num_accepted (`torch.LongTensor` of shape `(active,)`): drafted tokens accepted (the path's length - 1).
        next_token (`torch.LongTensor` of shape `(active,)`): the target's own token after them.
        tokens (`torch.LongTensor` of shape `(active, D+1)`): the accepted drafts, then `next_token`.
        emitted (`torch.LongTensor` of shape `(active,)`): how many of `tokens` were committed (fewer where an EOS,
            a stopping criterion or the length limit cut the row).
        hidden (`torch.Tensor` of shape `(active, D+1, hidden)`, *optional*): the target's last hidden state at
            every node of `path` (the root's where the path is shorter), for drafters that read it; at
            `num_accepted`, the one that chose `next_token`.
        outcome (`StepOutcome`, *optional*): the same counts as host values, read once by the loop: drafters
            steer their next step from these rather than reading device values themselves.
    """

    path: torch.Tensor
    num_accepted: torch.Tensor
    next_token: torch.Tensor
    tokens: torch.Tensor
    emitted: torch.Tensor
    hidden: torch.Tensor | None = None
    outcome: StepOutcome | None = None


def committed_tokens(accepted: Accepted) -> list[list[int]]:
    """Each row's committed tokens of the step, as host values (the loop's read of them, when it made one)."""
    if accepted.outcome is not None:
        return accepted.outcome.tokens
    return [row[:count] for row, count in zip(accepted.tokens.tolist(), accepted.emitted.tolist(), strict=True)]


@dataclasses.dataclass(frozen=True)
class DraftingContext:
    """What the loop knows once `generate()` has prepared it, for building its drafter.

    Attributes:
        target (`PreTrainedModel`): the target (the base model for Medusa heads).
        processors (`RaggedLogitsProcessor`): the logits processors of this call.
        do_sample (`bool`): sampling (else greedy).
        generator (`torch.Generator`, *optional*): randomness for sampling.
        vocab_size (`int`): the target's number of logits.
        costs (`CostModel`): the loop's cost model, which every adaptive decision weighs (the same object every
            `propose` receives).
        reads (`HostReads`, *optional*): the loop's one read per step, which values a drafter's host needs a
            step later can join (`HostReads.later`).
        generation_config (`GenerationConfig`, *optional*): the call's; a draft model keeps a static cache and
            runs compiled where it asks the target to (`cache_implementation`, `compile_config`).
    """

    target: PreTrainedModel
    processors: RaggedLogitsProcessor
    do_sample: bool
    generator: torch.Generator | None
    vocab_size: int
    costs: CostModel
    reads: HostReads | None = None
    generation_config: GenerationConfig | None = None


class Drafter(Protocol):
    """Proposes trees of tokens for the target to verify, and follows what the target committed."""

    #: The target's hidden states `start` and `commit` need, as indices of `output_hidden_states` (-1: the last,
    #: which Medusa heads read; EAGLE-3 heads fuse three), handed over concatenated in this order; `()`: none.
    hidden_state_layers: tuple[int, ...]
    #: The most drafted tokens one step's path can hold (room the token buffer keeps after `max_length`).
    max_depth: int

    def prefill(self, input_ids: torch.Tensor, valid: torch.Tensor, positions: torch.Tensor) -> None:
        """See the prompts `(batch, prompt)`: which tokens are real (`valid`) and their logical positions."""

    def start(self, first_token: torch.Tensor, hidden: torch.Tensor | None) -> None:
        """Record the target's first generated token `(batch,)` (and, with `hidden_state_layers`, the target's
        hidden states on the prompts `(batch, prompt, width)`: the last position's chose `first_token`)."""

    def propose(
        self,
        buffer: TokenBuffer,
        last_token: torch.Tensor,
        next_position: torch.Tensor,
        costs: CostModel,
        max_tokens: int,
    ) -> Proposal:
        """Draft a tree per active row, rooted at `last_token` `(active,)`, whose paths hold at most
        `max_tokens` drafted tokens (a drafter may go past it: positions are clamped and the commit cuts what
        the limit does not allow); `next_position` `(active,)` is the logical position of the first draft;
        `costs` the loop's cost model (`hf_specdec.generation.decisions`). Drafters whose own choices
        read the prefix write the drafted tokens into `buffer`, uncommitted."""

    def commit(self, accepted: Accepted) -> None:
        """Follow what the loop committed (roll caches back to the accepted path, learn acceptance rates)."""

    def follow(self, accepted: Accepted) -> None:
        """Follow a plain step, which the loop took without asking for drafts (drafting was not expected to
        pay): each row's last token was verified alone, and `accepted.tokens[:, 0]` is the target's next token
        (with the hidden state that chose it in `accepted.hidden` `(active, 1, H)` with `hidden_state_layers`)."""

    def select_rows(self, keep: torch.Tensor) -> None:
        """Follow the batch when finished rows leave it (`keep`: positions in the old active order)."""


@runtime_checkable
class FreeProposals(Protocol):
    """A drafter with proposals that cost no drafter forward (prompt lookup's, beside a draft model's chains or
    trees, or Medusa or EAGLE heads): the loop asks for one on the steps the speculation gate keeps plain, where the
    drafter's costly proposals do not pay."""

    def propose_free(
        self,
        buffer: TokenBuffer,
        last_token: torch.Tensor,
        next_position: torch.Tensor,
        costs: CostModel,
        max_tokens: int,
    ) -> Proposal | None:
        """As `Drafter.propose`, from the free part of the drafter only; `None` where it proposes nothing (the
        step is then plain, and followed with `Drafter.follow`). A proposal returned is committed with
        `Drafter.commit`."""


#: Builds the drafter of one `generate()` call once the loop has prepared its context.
DrafterFactory = Callable[[DraftingContext], Drafter]


def chain_proposal(
    last_token: torch.Tensor,
    tokens: torch.Tensor,
    q: torch.Tensor | None = None,
    lengths: torch.Tensor | None = None,
    forwards: int = 0,
    looked_up: bool = False,
    catch_up: bool = False,
    started: bool = False,
    plain: bool = False,
) -> Proposal:
    """A chain per row as a `Proposal`.

    Args:
        last_token (`torch.LongTensor` of shape `(active,)`): the root.
        tokens (`torch.LongTensor` of shape `(active, k)`): the drafted tokens, in order.
        q (`torch.Tensor` of shape `(active, k, vocab)`, *optional*): the distribution each draft was drawn from.
        lengths (`torch.LongTensor` of shape `(active,)`, *optional*): how many of the k tokens each row really
            drafted (the rest is filler, never accepted); all k when `None`.
        forwards, looked_up, catch_up, started, plain: as in `Proposal`.
    """
    batch, k = tokens.shape
    nodes = torch.cat([last_token[:, None].to(tokens.device), tokens], dim=1)  # (A, k+1)
    trees = RowTrees.chain(k + 1, tokens.device, batch)
    drafted = k if lengths is None else lengths
    if lengths is not None:  # filler after a row's own drafts: padding, tried by no rule
        real = trees.depths <= lengths[:, None]  # (A, k+1)
        children = torch.where(trees.depths[..., None] < lengths[:, None, None], trees.children, -1)  # (A, k+1, 1)
        trees = dataclasses.replace(trees, real=real, children=children)
    # q at node j is what node j's child (draft j) was drawn from; the last node has no child, and no row of q.
    return Proposal(nodes, trees, q, drafted, forwards, looked_up, catch_up, chain=True, started=started, plain=plain)


class Chain(NamedTuple):
    """A chain drafter's proposal in its own terms (see `chain_proposal` for the arguments)."""

    tokens: torch.Tensor
    q: torch.Tensor | None = None
    lengths: torch.Tensor | None = None
    forwards: int = 0
    looked_up: bool = False
    catch_up: bool = False
    started: bool = False
    plain: bool = False


class ChainDrafter:
    """The `Drafter` protocol for drafters that propose one chain per row: they implement `draft_chain` and
    `commit_chain` (with the number of tokens drafted), and this base turns them into trees and back."""

    hidden_state_layers: tuple[int, ...] = ()
    max_depth: int
    _num_drafted = 0

    def draft_chain(self, buffer: TokenBuffer, next_position: torch.Tensor, costs: CostModel, max_tokens: int) -> Chain:
        raise NotImplementedError

    def commit_chain(
        self,
        num_accepted: torch.Tensor,
        num_drafted: int,
        next_token: torch.Tensor,
        outcome: StepOutcome | None = None,
    ) -> None:
        raise NotImplementedError

    def start(self, first_token: torch.Tensor, hidden: torch.Tensor | None) -> None:
        """Nothing to do by default: chain drafters read committed tokens from the buffer."""

    def propose(
        self,
        buffer: TokenBuffer,
        last_token: torch.Tensor,
        next_position: torch.Tensor,
        costs: CostModel,
        max_tokens: int,
    ) -> Proposal:
        return self.proposal_of(last_token, self.draft_chain(buffer, next_position, costs, max_tokens))

    def proposal_of(self, last_token: torch.Tensor, chain: Chain) -> Proposal:
        """`chain` as the `Proposal` of this step, remembering how many tokens it drafted for `commit`."""
        self._num_drafted = chain.tokens.shape[1]
        return chain_proposal(last_token, *chain)

    def commit(self, accepted: Accepted) -> None:
        self.commit_chain(accepted.num_accepted, self._num_drafted, accepted.next_token, accepted.outcome)

    def follow(self, accepted: Accepted) -> None:
        """Nothing to do by default: chain drafters read committed tokens from the buffer."""


def append_pending(
    features: torch.Tensor, tokens: torch.Tensor, count: torch.Tensor, accepted: Accepted, most: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A step a drafter fed the target's hidden states did not draft (a plain step, or prompt lookup's chain alone):
    each row's accepted path (every node's hidden state, and the token after it) joins the row's pending entries
    `features` `(A, P, H)` and `tokens` `(A, P)` after its `count` `(A,)` real ones. `most`: at least the longest
    path, known to the host (1 after a plain step). Returns the new entries and counts."""
    assert accepted.hidden is not None
    rows, width, size = features.shape
    # One column past the new ones takes the writes of nodes past a row's path, then is cut off.
    features = torch.cat([features, features.new_zeros(rows, most + 1, size)], dim=1)
    tokens = torch.cat([tokens, tokens.new_zeros(rows, most + 1)], dim=1)
    node = torch.arange(most, device=count.device)[None, :]  # (1, most)
    on_path = node <= accepted.num_accepted[:, None].to(count.device)  # (A, most)
    slot = torch.where(on_path, count[:, None] + node, width + most)
    features.scatter_(1, slot[..., None].expand(-1, -1, size), accepted.hidden[:, :most].to(features))
    tokens.scatter_(1, slot, accepted.tokens[:, :most].to(tokens))
    return features[:, : width + most], tokens[:, : width + most], count + on_path.sum(dim=1)
