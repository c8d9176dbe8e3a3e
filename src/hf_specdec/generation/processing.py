"""Apply transformers' `LogitsProcessorList` at many positions of a ragged batch at once.

Plain `generate()` calls its processors once per token with the whole batch, whose rows all have the same
length. Speculative decoding needs the processed scores at drafted positions, and rows of a batch have
committed different numbers of tokens, so position j of row b sees the prefix `tokens[b, :lengths[b] + j]`
(its prompt with the same left padding as plain `generate()`, its committed tokens, then the drafted tokens
before j). Processors that read the prefix (repetition penalty, minimum length, n-gram bans, constraints, ...)
are called once per distinct prefix length, with the whole batch in its original row order (some processors
keep per-row state, such as the left-padding length, or hand the row's index to a callback); the rows not
being scored show their committed tokens and then padding, as plain `generate()` shows a finished row.
Processors that only look at the scores (temperature, top-k, top-p, ...) are called once on everything.

Verification (`verification_scores`) scores drafted nodes lazily when a processor reads the prefix: a node is
scored only once the path to it could be accepted (greedy: every token on it is the target's argmax; sampling:
every token has a nonzero probability), and never after an EOS or past the length limit, where plain decoding
stops. So processors and callbacks such as `prefix_allowed_tokens_fn` see the prefixes plain decoding produces
(greedy) or could produce (sampling), never a draft the target rules out.

Processors must be functions of the prefix and the scores (transformers' own are, but for SynthID text
watermarking, which counts its calls and is refused): they are called on drafted prefixes, and more than once
per generated token. transformers' own processors that read the prefix only to count its length, penalise
its tokens or ban continuations (`min_new_tokens`, `repetition_penalty`, `no_repeat_ngram_size`,
`bad_words_ids`, ...) can be shown any prefix: with them (`RaggedLogitsProcessor.any_prefix`) every drafted
node is scored at once and the host reads nothing to choose which; the scores of nodes plain decoding would
never reach are computed and never read.

The host groups positions by prefix length from lengths it knows (`TokenBuffer.host_lengths`), so scoring
reads nothing back from the device; given device lengths only, it reads them once.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from transformers import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    ExponentialDecayLengthPenalty,
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    InfNanRemoveLogitsProcessor,
    LogitNormalization,
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor,
    SuppressTokensLogitsProcessor,
    SynthIDTextWatermarkLogitsProcessor,
    TemperatureLogitsWarper,
    TopHLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from hf_specdec.generation.sequences import TokenBuffer, length_groups
from hf_specdec.trees.row_trees import RowTrees

# Processors whose output depends on the scores alone, not on the prefix they are called with.
_PREFIX_FREE = (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TopHLogitsWarper,
    MinPLogitsWarper,
    TypicalLogitsWarper,
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    SuppressTokensLogitsProcessor,
    LogitNormalization,
    InfNanRemoveLogitsProcessor,
)

# Processors that read the prefix, are pure functions of it and the scores, and take any prefix (one plain
# decoding never shows included) without failing: drafts may be scored before it is known that they are reachable.
_ANY_PREFIX = (
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    NoBadWordsLogitsProcessor,
    SequenceBiasLogitsProcessor,
    ExponentialDecayLengthPenalty,
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor,
)

# Processors that keep state from call to call, so that calling them on drafts changes what they do.
_STATEFUL = {
    SynthIDTextWatermarkLogitsProcessor: (
        "SynthID text watermarking (`watermarking_config=SynthIDTextWatermarkingConfig(...)`) keeps a context "
        "and a call count from one call to the next"
    ),
}


class RaggedLogitsProcessor:
    """Wraps a `LogitsProcessorList` so it can score `(batch, n, vocab)` logits with per-row prefixes.

    Args:
        processors (`LogitsProcessorList`): the processors `generate()` built from the generation config.

    Raises:
        `ValueError`: for processors that keep state between calls (see `_STATEFUL`).
    """

    def __init__(self, processors: LogitsProcessorList) -> None:
        for processor in processors:
            for kind, why in _STATEFUL.items():
                if isinstance(processor, kind):
                    raise ValueError(
                        f"{type(processor).__name__}: {why}, and speculative decoding calls logits processors on "
                        "drafted tokens and several times per generated token, so its output would differ from "
                        "plain decoding. Generate with plain `generate()` to watermark."
                    )
        self.processors = processors
        # Exact types: a subclass may read the prefix.
        self.prefix_free = all(type(p) in _PREFIX_FREE for p in processors)
        # Whether drafts may be scored without first checking that plain decoding could reach them.
        self.any_prefix = all(type(p) in _PREFIX_FREE or type(p) in _ANY_PREFIX for p in processors)

    def __call__(
        self,
        buffer: TokenBuffer,
        rows: torch.Tensor,
        lengths: torch.Tensor,
        logits: torch.Tensor,
        host_lengths: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Process logits at n consecutive positions of each row.

        Args:
            buffer (`TokenBuffer`): every row's tokens; the drafted tokens of the scored rows are already written
                after their committed tokens.
            rows (`torch.LongTensor` of shape `(batch,)`): which rows of the buffer the logits belong to.
            lengths (`torch.LongTensor` of shape `(batch,)`): prefix length at the first of the n positions.
            logits (`torch.Tensor` of shape `(batch, n, vocab)`): raw scores, float32.
            host_lengths (`Sequence[int]`, *optional*): `lengths` as the host knows them; without them, processors
                that read the prefix cost one read of `lengths`.

        Returns:
            `torch.Tensor` of shape `(batch, n, vocab)`: the processed scores.
        """
        if not self.processors:
            return logits
        batch, n, vocab = logits.shape
        if batch == 0:
            return logits
        if self.prefix_free:
            flat = logits.reshape(batch * n, vocab)  # (B*n, V)
            dummy = buffer.tokens.new_zeros(batch * n, 1)  # these processors never read the prefix
            return self.processors(dummy, flat).reshape(batch, n, vocab)
        if host_lengths is None:
            host_lengths = lengths.tolist()
        out = torch.empty_like(logits)
        full = logits.new_zeros(buffer.tokens.shape[0], vocab)  # (total_batch, V): every row at its own index
        first = min(host_lengths)
        groups = length_groups(tuple(length - first for length in host_lengths), n)
        for offset, b_list, j_list in groups:
            b = torch.tensor(b_list).to(logits.device, non_blocking=True)  # pairs whose prefix has this length
            j = torch.tensor(j_list).to(logits.device, non_blocking=True)
            shown = rows[b]
            full[shown] = logits[b, j]
            # The other rows' scores are not read: they get a scored row's prefix and scores, so that a processor
            # only ever sees what some row really holds (a row's committed tokens followed by padding can be a
            # prefix plain decoding never shows, on which a processor may ban every token and a warper fail).
            others = torch.ones(full.shape[0], dtype=torch.bool, device=full.device).index_fill_(0, shown, False)
            prefixes = buffer.prefixes(first + offset, shown)
            prefixes = torch.where(others[:, None], prefixes.index_select(0, shown[:1]), prefixes)
            scores = torch.where(others[:, None], full.index_select(0, shown[:1]), full)
            out[b, j] = self.processors(prefixes, scores)[shown]
        return out


def score_nodes(
    processors: RaggedLogitsProcessor,
    buffer: TokenBuffer,
    paths: torch.Tensor,
    depths: list[list[int]],
    logits: torch.Tensor,
) -> torch.Tensor:
    """Processed scores `(active, nodes, vocab)` after every node of each active row, for processors that take
    any prefix (`any_prefix`): their state per row indexed by the rows shown (`for_rows`), the prefixes of any
    rows and nodes that have the same length are scored in one call. Reads nothing from the device.

    Args:
        paths (`torch.LongTensor` of shape `(active, nodes, D)`): the drafted tokens from the root's child to each
            node (the first `depths[b][n]` of them are read).
        depths (`list[list[int]]`): each node's depth, as host values.
        logits (`torch.Tensor` of shape `(active, nodes, vocab)`): raw scores after each node.
    """
    out = torch.empty_like(logits)
    device, width = logits.device, paths.shape[2]
    committed = buffer.active_host_lengths
    groups: dict[int, tuple[list[int], list[int], list[int]]] = {}
    for b, (length, row) in enumerate(zip(committed, depths, strict=True)):
        for n, depth in enumerate(row):
            rows, columns, cut = groups.setdefault(length + depth, ([], [], []))
            rows.append(b)
            columns.append(n)
            cut.append(depth)
    steps = torch.arange(width, device=device)
    for length, (rows, columns, cut) in groups.items():
        b = torch.tensor(rows).to(device, non_blocking=True)
        n = torch.tensor(columns).to(device, non_blocking=True)
        depth = torch.tensor(cut).to(device, non_blocking=True)
        # The row's committed tokens, then the node's path; a spare last column takes the path's unread tail.
        prefixes = buffer.tokens[buffer.active[b], : length + 1].clone()  # (G, length + 1)
        where = torch.where(steps < depth[:, None], buffer.lengths[buffer.active[b]][:, None] + steps, length)
        prefixes.scatter_(1, where, paths[b, n])
        shown = for_rows(processors.processors, buffer.active[b])
        out[b, n] = shown(prefixes[:, :length], logits[b, n])
    return out


def for_rows(processors: LogitsProcessorList, rows: torch.Tensor) -> LogitsProcessorList:
    """`processors` as they apply to the batch's `rows` `(G,)` (original indices, any order, repeats allowed)
    alone: the per-row state a processor that takes any prefix keeps (the repetition penalty's left padding to
    ignore) is indexed by `rows`; the processors are shallow copies, the originals are left as they are."""
    out = []
    for processor in processors:
        ignored = getattr(processor, "prompt_ignore_length", None)
        if type(processor) is RepetitionPenaltyLogitsProcessor and isinstance(ignored, torch.Tensor):
            processor = copy.copy(processor)
            processor.prompt_ignore_length = ignored.to(rows.device)[rows]
        out.append(processor)
    return LogitsProcessorList(out)


def verification_scores(
    processors: RaggedLogitsProcessor,
    buffer: TokenBuffer,
    nodes: torch.Tensor,
    logits: torch.Tensor,
    trees: RowTrees,
    do_sample: bool,
    chain: bool = False,
) -> torch.Tensor:
    """The target's processed scores `(active, nodes, vocab)` after every node of each active row's tree.

    Node 0 is the root (the row's last committed token); a node's prefix is the row's committed tokens and the
    drafted tokens on its path. Processors that read only the scores run once over all nodes; processors that
    take any prefix run once per prefix length over every node (`score_nodes`; `chain`: node i at depth i,
    which a tree would read from the device). The others run
    depth by depth over the nodes that could still be accepted (module docstring); the nodes they never
    reach keep their raw `logits`, which no acceptance rule reads: a node is accepted only when its parent's
    scores allow its token.
    """
    if processors.prefix_free:
        return processors(buffer, buffer.active, buffer.active_lengths, logits)
    if processors.any_prefix:
        batch, num_nodes = nodes.shape
        if chain:  # node i at depth i, its path the drafts before it
            depths = [list(range(num_nodes))] * batch
            paths = nodes[:, None, 1:].expand(batch, num_nodes, num_nodes - 1)
        else:  # a tree's shape: one read (none for a static tree's later steps)
            depths = trees.host_depths
            on_path = trees.paths[:, :, 1:].clamp_min(0)  # (A, N, D)
            paths = nodes.gather(1, on_path.reshape(batch, -1)).reshape(on_path.shape)
        return score_nodes(processors, buffer, paths, depths, logits)
    scores = logits.clone()
    lengths = buffer.active_lengths
    # Plain decoding scores no prefix past the length limit, and none after an EOS (the row stops there).
    deepest = buffer.max_length - 1 - lengths  # (A,)
    ends = torch.isin(nodes, buffer.eos) if buffer.eos is not None else torch.zeros_like(nodes, dtype=torch.bool)
    ends[:, 0] = False  # the root is committed: the row would have stopped at an EOS
    reached = torch.zeros(nodes.shape, dtype=torch.bool, device=nodes.device)
    reached[:, 0] = True
    for depth in range(trees.depth + 1):
        waiting = reached & (trees.depths == depth) & (depth <= deepest)[:, None] & ~ends  # (A, N)
        while bool(waiting.any()):  # one node per row at a time: a row's prefix holds one path
            rows = waiting.any(dim=1).nonzero(as_tuple=True)[0]  # (S,)
            node = waiting[rows].to(torch.int8).argmax(dim=1)  # (S,) the row's first waiting node
            waiting[rows, node] = False
            if depth:
                path = trees.paths[rows, node, 1 : depth + 1]  # (S, depth) the drafted nodes up to this one
                buffer.write(0, nodes[rows[:, None], path], rows=rows)
            processed = processors(buffer, buffer.active[rows], lengths[rows] + depth, logits[rows, node][:, None])
            processed = processed[:, 0]  # (S, V)
            scores[rows, node] = processed
            # The children this node's scores leave a chance of being accepted.
            children = trees.children[rows, node]  # (S, C), -1 after the last
            tokens = nodes[rows[:, None], children.clamp_min(0)]  # (S, C)
            if do_sample:
                possible = processed.softmax(dim=-1).gather(1, tokens) > 0
            else:
                possible = tokens == processed.argmax(dim=-1, keepdim=True)
            possible &= (children >= 0) & trees.real[rows[:, None], children.clamp_min(0)]
            which, child = possible.nonzero(as_tuple=True)
            reached[rows[which], children[which, child]] = True
    return scores
