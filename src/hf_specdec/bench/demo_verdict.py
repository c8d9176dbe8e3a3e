"""The demo's verdict on a speculative path: the run it shows, held against plain `generate()`'s run it shows.

Greedy speculative decoding gives plain greedy's tokens exactly in float32. In bfloat16 a forward over several
tokens rounds differently from one over a single token, so where the target's two best tokens are within rounding
of each other (a tie at that precision) either may come first, and the outputs part there. The verdict says where
a run parts from plain's, which two tokens the target chose between, and how far apart it scores them (plain's
token minus the other, from one forward over plain's text): a tie when within `BF16_TIE_GAP`, otherwise a bug.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from hf_specdec.bench.runner import BF16_TIE_GAP, compare_to_plain, row_lengths
from hf_specdec.generation.validation import eos_token_ids


@dataclass(frozen=True)
class Parting:
    """Where a row of a run first differs from plain's.

    Attributes:
        row (`int`): the row of the batch.
        position (`int`): the generated token (from 1) where they part.
        plain_token, other_token (`str`): the two tokens there, as text (`None` where one row has stopped).
        gap (`float`, *optional*): the target's logit of plain's token minus the other's (`None` where one stopped).
    """

    row: int
    position: int
    plain_token: str | None
    other_token: str | None
    gap: float | None

    @property
    def tie(self) -> bool:
        return self.gap is not None and abs(self.gap) <= BF16_TIE_GAP


def partings(
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    plain: torch.Tensor,
    other: torch.Tensor,
    inputs: dict[str, torch.Tensor],
) -> list[Parting]:
    """Every row of `other` that differs from `plain` (both `(batch, length)` with the prompts), where it parts."""
    prompt = inputs["input_ids"].shape[1]
    lengths = row_lengths(plain, prompt, eos_token_ids(target))
    _, divergences = compare_to_plain(target, plain, other, inputs, lengths)
    found = []
    for d in divergences:
        row, first = d["row"], d["position"]
        column = prompt + first
        texts: list[str | None] = [
            tokenizer.decode(tokens[row, column : column + 1]) if column < tokens.shape[1] else None
            for tokens in (plain, other)
        ]
        found.append(Parting(row, first + 1, texts[0], texts[1], d["gap"]))
    return found


def describe(parting: Parting, dtype: torch.dtype, batch_size: int) -> str:
    """One sentence: where the run parts from plain's, and whether at a tie (in words, with the fix to check)."""
    where = f"at generated token {parting.position}" + (f" of row {parting.row}" if batch_size > 1 else "")
    if parting.gap is None:
        return (
            f"parts from plain's {where}, where one of them stops (an end-of-sequence token one chose at a tie, "
            "or the other ran to the length limit)."
        )
    chose = f"plain chose {parting.plain_token!r}, this run {parting.other_token!r}"
    side = "above" if parting.gap >= 0 else "below"
    apart = (
        f"the target scores the two {abs(parting.gap):.3f} apart (plain's token {side} the other, in one forward "
        "over plain's text)"
    )
    precision = str(dtype).removeprefix("torch.")
    if parting.tie:
        return (
            f"parts from plain's {where}: {chose}; {apart}, within {precision}'s rounding of a logit (ties are gaps "
            f"up to {BF16_TIE_GAP}): both are the target's greedy choice at this precision, and which comes first "
            "depends on how many tokens a forward computes. Run with --dtype float32 to check the tokens exactly."
        )
    return f"parts from plain's {where}: {chose}; {apart}: NOT a numerical tie. Please report it."


def verdict_lines(
    shown: list[Parting], others: list[list[Parting]], dtype: torch.dtype, batch_size: int
) -> tuple[list[str], bool]:
    """The verdict on a path: the run shown (`shown`: where it parts from plain's shown run, empty when identical),
    then the path's other timed runs (`others`, each's partings). Returns the lines and whether every run parts only
    at ties (float32: not at all)."""
    runs = 1 + len(others)
    identical_runs = sum(not parts for parts in [shown, *others])
    count = f" ({identical_runs} of {runs} timed runs identical)" if runs > 1 else ""
    if not shown:
        lines = [f"tokens: identical to plain generate()'s{count}"]
    else:
        lines = [f"tokens: the median run {describe(shown[0], dtype, batch_size)}{count}"]
        lines += [f"  also {describe(parting, dtype, batch_size)}" for parting in shown[1:]]
    other_real = [parting for parts in others for parting in parts if not parting.tie]
    lines += [f"  another timed run {describe(parting, dtype, batch_size)}" for parting in other_real[:1]]
    if any(others) and not other_real:
        lines.append(
            "  the other timed runs that differ part from plain's at numerical ties only (the target's two best "
            f"logits within {BF16_TIE_GAP} of each other)"
        )
    every = [parting for parts in [shown, *others] for parting in parts]
    passed = not every if dtype == torch.float32 else all(parting.tie for parting in every)
    return lines, passed
