"""Prompt lookup drafting: propose what followed the last n-gram the last time it occurred in the row.

Code edits, summaries, answers about a document and chat that quotes its context repeat long spans of the
prompt (and of what was generated so far). Prompt lookup decoding (Saxena, 2023) drafts such spans for free:
find the row's last `n` tokens earlier in the row, and propose the tokens that followed them there. No draft
model runs, so a step costs one target forward over `1 + k` tokens per row; where nothing repeats, a row
drafts nothing and the step is a plain decoding step.

Drafts are proposed with certainty (q is 1 on the drafted token), so greedy verification keeps plain greedy's
tokens and `acceptance.point_draft_sampling` keeps the target's sampling distribution exactly.

Transformers' own `prompt_lookup_num_tokens` runs at batch size 1 and takes the earliest match; this drafter
serves any batch size, each row searching its own tokens, and takes the most recent match of the longest
n-gram (recent context predicts the continuation better: on the benchmark's prompts it accepts slightly more).

How far to trust a match depends mostly on its length. Replaying lookup over Qwen2.5-Coder-1.5B's greedy
replies to the benchmark's prompts, the first looked-up token was right after 23-32% of single-token
matches and after 82% or more of 3-token matches. So the acceptance rate by draft position is measured
separately for each matched n-gram size, starting from a prior per size taken from that replay
(`decisions.constants.PRIOR_ACCEPTANCE`), so that long matches are tried from the first step. With the
"adaptive" schedule the batch drafts as far as its matches are expected to pay for verification: every row is
verified to the same width (a row that drafts less is padded, at the same cost), so the width grows while one
more position is expected to bring its cost times the rate recent steps brought (`decisions.shared_width`) to
the least advanced rows (a batched call ends with its last row); at batch size 1 that is the row's own match.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from hf_specdec.drafters.acceptance_history import HistoryByMatchSize
from hf_specdec.generation.arguments import DEFAULT_MAX_MATCHING_NGRAM_SIZE
from hf_specdec.generation.decisions import CostModel, shared_width
from hf_specdec.generation.drafter import Chain, ChainDrafter
from hf_specdec.generation.readback import StepOutcome
from hf_specdec.generation.sequences import TokenBuffer
from hf_specdec.trees.lookup_graft import graft_chains
from hf_specdec.trees.row_trees import RowTrees


def lookup_continuation(tokens: Sequence[int], max_ngram_size: int, num_tokens: int) -> tuple[list[int], int]:
    """The tokens that followed the most recent earlier occurrence of the longest matching suffix n-gram.

    Args:
        tokens (sequence of `int`): one row's tokens, oldest first (host values: lookup never waits for the
            device).
        max_ngram_size (`int`): the longest suffix to look for; shorter ones are tried down to a single token.
        num_tokens (`int`): the most tokens to return.

    Returns:
        `(continuation, n)`: at most `num_tokens` tokens, and the size of the matched n-gram (`([], 0)` when no
        suffix occurs earlier). When the continuation reaches the end of the row (a repeating stretch:
        indentation, `----`, a cycle of tokens) it is repeated with that period up to `num_tokens`.
    """
    row = np.asarray(tokens, dtype=np.int64)
    length = row.shape[0]
    for n in range(min(max_ngram_size, length - 1), 0, -1):
        # Windows that start early enough for at least one token to follow them inside the row.
        windows = np.lib.stride_tricks.sliding_window_view(row[: length - 1], n)  # (length - n, n)
        hits = np.flatnonzero((windows == row[length - n :]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            continuation = row[start : start + num_tokens].tolist()
            if len(continuation) < num_tokens:
                # The match ends the row: the text repeats with period `length - start`; go on repeating it.
                continuation = (continuation * -(-num_tokens // len(continuation)))[:num_tokens]
            return continuation, n
    return [], 0


class PromptLookupDrafter(ChainDrafter):
    """Drafts, for every row, the continuation of its last n-gram's most recent earlier occurrence.

    Args:
        num_tokens (`int`): the most tokens a row drafts per step (`prompt_lookup_num_tokens`).
        max_ngram_size (`int`): the longest n-gram to match (`max_matching_ngram_size`).
        adaptive (`bool`): draft, per row, only as far as its match is expected to pay for verification (from
            the acceptance measured for matches of its size); otherwise always up to `num_tokens`.
    """

    def __init__(
        self, num_tokens: int, max_ngram_size: int = DEFAULT_MAX_MATCHING_NGRAM_SIZE, adaptive: bool = True
    ) -> None:
        for name, value in (("prompt_lookup_num_tokens", num_tokens), ("max_matching_ngram_size", max_ngram_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        self.num_tokens = num_tokens
        self.max_ngram_size = max_ngram_size
        self.adaptive = adaptive
        self.max_depth = num_tokens
        # Acceptance by draft position, per matched n-gram size.
        self.history = HistoryByMatchSize()
        self.starts: list[int] | None = None  # per row of the batch: its first real token (after left padding)
        self._sizes: list[int] = []  # matched n-gram size per row in the last proposal (0: no match)
        self._tokens: list[list[int]] = []  # per row the last proposal's looked-up tokens
        self._lengths: list[int] = []  # and how many of them it drafted

    def prefill(self, input_ids: torch.Tensor, valid: torch.Tensor, positions: torch.Tensor) -> None:
        """Note where each row's real tokens start, so that left padding is never matched."""
        self.starts = valid.long().argmax(dim=1).tolist()  # first valid column (0 when the row has none)

    def graft(
        self,
        nodes: torch.Tensor,
        trees: RowTrees,
        buffer: TokenBuffer,
        next_position: torch.Tensor,
        costs: CostModel,
        max_tokens: int,
    ) -> tuple[torch.Tensor, RowTrees, bool]:
        """Each row's looked-up continuation grafted onto its tree of `nodes` (`hf_specdec.trees.lookup_graft`), as
        far as `draft_chain` drafts it: `(nodes, trees, looked_up)`."""
        chain = self.draft_chain(buffer, next_position, costs, max_tokens)
        assert chain.lengths is not None
        nodes, trees = graft_chains(nodes, trees, chain.tokens, chain.lengths)
        return nodes, trees, chain.looked_up

    def draft_chain(self, buffer: TokenBuffer, next_position: torch.Tensor, costs: CostModel, max_tokens: int) -> Chain:
        """Look up up to `num_tokens` tokens (at most `max_tokens`) for every active row and write them into
        `buffer` after each row's committed tokens (uncommitted), where the logits processors of verification
        read them. `costs`: the loop's, which measures what verifying one more token per row costs.

        Rows draft different numbers of tokens (none without a match); `k` is the longest, and shorter rows are
        padded with filler that the `lengths` of the proposal exclude from acceptance.
        """
        assert self.starts is not None
        rows = buffer.active_rows
        most = max(min(self.num_tokens, max_tokens), 1)  # never more than the row can still commit
        texts = [buffer.host_tokens[row][self.starts[row] :] for row in rows]  # committed tokens, after padding
        matches = [lookup_continuation(text, self.max_ngram_size, most) for text in texts]
        self._sizes = [n for _, n in matches]
        width = most
        if self.adaptive:  # c = 0: a lookup costs no draft forward; one more position costs v * rows
            survivals = [self.history[n].survival(len(continuation)) if n else [] for continuation, n in matches]
            width = shared_width(survivals, buffer.lagging_rows(), costs.threshold(len(rows)), costs.step_threshold())
        found = [continuation[: max(min(width, max_tokens), 0)] for continuation, _ in matches]
        self._lengths = [len(f) for f in found]
        k = max(self._lengths, default=0)
        # Filler after a row's own tokens (its last one, never accepted) keeps the width shared.
        self._tokens = [f + [f[-1] if f else 0] * (k - len(f)) for f in found]
        device = buffer.tokens.device
        tokens = torch.tensor(self._tokens, dtype=torch.long).reshape(len(rows), k).to(device, non_blocking=True)
        lengths = torch.tensor(self._lengths, dtype=torch.long).to(device, non_blocking=True)
        buffer.write(0, tokens)
        return Chain(tokens, lengths=lengths, looked_up=any(self._lengths))

    def expected_tokens(self) -> float:
        """Expected committed tokens per row of the last proposal: one from the target plus, per drafted
        position, the measured chance (for the row's match size) that it and every earlier draft are accepted."""
        total = sum(
            self.history[n].expected_tokens([length]) if n else 1.0
            for n, length in zip(self._sizes, self._lengths, strict=True)
        )
        return total / max(len(self._lengths), 1)

    def commit_chain(
        self,
        num_accepted: torch.Tensor,
        num_drafted: int,
        next_token: torch.Tensor,
        outcome: StepOutcome | None = None,
    ) -> None:
        """Record, for each matched n-gram size, how far its rows' drafts were accepted."""
        host = outcome.num_accepted if outcome is not None else num_accepted.tolist()
        self._record(num_drafted, host, self._lengths)

    def observe(self, committed: list[list[int]]) -> None:
        """Learn from a step another drafter drafted: row b committed the tokens `committed[b]`. A looked-up
        token that equals the committed one (and every earlier one did) would have been accepted; positions
        past the committed tokens are unknown and not counted."""
        width = max((len(t) for t in self._tokens), default=0)
        seen = [min(length, len(tokens)) for length, tokens in zip(self._lengths, committed, strict=True)]
        matched = []
        for looked_up, tokens, known in zip(self._tokens, committed, seen, strict=True):
            same = 0
            while same < known and looked_up[same] == tokens[same]:
                same += 1
            matched.append(same)
        self._record(width, matched, seen)

    def _record(self, k: int, num_accepted: list[int], lengths: list[int]) -> None:
        for n in sorted(set(self._sizes) - {0}):
            rows = [i for i, size in enumerate(self._sizes) if size == n]
            self.history[n].update(k, [num_accepted[i] for i in rows], [lengths[i] for i in rows])

    def select_rows(self, keep: torch.Tensor) -> None:
        """Nothing to follow: rows are looked up by their index in the batch."""
