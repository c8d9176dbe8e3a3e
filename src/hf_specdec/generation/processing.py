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
per generated token.
"""

from __future__ import annotations

import torch
from transformers import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    InfNanRemoveLogitsProcessor,
    LogitNormalization,
    LogitsProcessorList,
    MinPLogitsWarper,
    SuppressTokensLogitsProcessor,
    SynthIDTextWatermarkLogitsProcessor,
    TemperatureLogitsWarper,
    TopHLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from hf_specdec.generation.sequences import TokenBuffer
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

    def __call__(
        self, buffer: TokenBuffer, rows: torch.Tensor, lengths: torch.Tensor, logits: torch.Tensor
    ) -> torch.Tensor:
        """Process logits at n consecutive positions of each row.

        Args:
            buffer (`TokenBuffer`): every row's tokens; the drafted tokens of the scored rows are already written
                after their committed tokens.
            rows (`torch.LongTensor` of shape `(batch,)`): which rows of the buffer the logits belong to.
            lengths (`torch.LongTensor` of shape `(batch,)`): prefix length at the first of the n positions.
            logits (`torch.Tensor` of shape `(batch, n, vocab)`): raw scores, float32.

        Returns:
            `torch.Tensor` of shape `(batch, n, vocab)`: the processed scores.
        """
        if not self.processors:
            return logits
        batch, n, vocab = logits.shape
        if self.prefix_free:
            flat = logits.reshape(batch * n, vocab)  # (B*n, V)
            dummy = buffer.tokens.new_zeros(batch * n, 1)  # these processors never read the prefix
            return self.processors(dummy, flat).reshape(batch, n, vocab)
        prefix_lengths = lengths[:, None] + torch.arange(n, device=lengths.device)  # (B, n)
        out = torch.empty_like(logits)
        full = logits.new_zeros(buffer.tokens.shape[0], vocab)  # (total_batch, V): every row at its own index
        for length in torch.unique(prefix_lengths).tolist():
            b, j = (prefix_lengths == length).nonzero(as_tuple=True)  # pairs whose prefix has this length
            shown = rows[b]
            full[shown] = logits[b, j]
            # The other rows' scores are not read: they get a scored row's prefix and scores, so that a processor
            # only ever sees what some row really holds (a row's committed tokens followed by padding can be a
            # prefix plain decoding never shows, on which a processor may ban every token and a warper fail).
            others = torch.ones(full.shape[0], dtype=torch.bool, device=full.device).index_fill_(0, shown, False)
            prefixes = buffer.prefixes(length, shown)
            prefixes = torch.where(others[:, None], prefixes[shown[0]][None, :], prefixes)
            scores = torch.where(others[:, None], full[shown[0]][None, :], full)
            out[b, j] = self.processors(prefixes, scores)[shown]
        return out


def verification_scores(
    processors: RaggedLogitsProcessor,
    buffer: TokenBuffer,
    nodes: torch.Tensor,
    logits: torch.Tensor,
    trees: RowTrees,
    do_sample: bool,
) -> torch.Tensor:
    """The target's processed scores `(active, nodes, vocab)` after every node of each active row's tree.

    Node 0 is the root (the row's last committed token); a node's prefix is the row's committed tokens and the
    drafted tokens on its path. Processors that read only the scores run once over all nodes. The others run
    depth by depth over the nodes that could still be accepted (module docstring); the nodes they never
    reach keep their raw `logits`, which no acceptance rule reads: a node is accepted only when its parent's
    scores allow its token.
    """
    if processors.prefix_free:
        return processors(buffer, buffer.active, buffer.active_lengths, logits)
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
