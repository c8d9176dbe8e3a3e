"""Draft vocabularies: the token ids a drafter may propose, chosen by how often text uses them.

A drafter's output projection over a large vocabulary is a big share of its cost (Qwen2.5: 151,936 rows,
28% of the 0.5B draft's weights; a Medusa head sharing a 1.5B base's lm_head costs 15% of the base per
head). Text uses few of those tokens: restricting what a drafter may *propose* to the most frequent ones
cuts that cost several-fold. It is lossless, since the target verifies every token with its full
vocabulary and emits what it would have emitted; a token outside the subset can only not be guessed.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def count_tokens(sequences: Iterable[Sequence[int] | torch.Tensor], vocab_size: int) -> torch.Tensor:
    """How often every token id in `0..vocab_size-1` occurs in `sequences` (negative ids, i.e. ignored
    labels, are skipped), as a `(vocab_size,)` int64 tensor."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for sequence in sequences:
        ids = torch.as_tensor(sequence, dtype=torch.long).flatten().cpu()
        ids = ids[ids >= 0]
        if ids.numel() and int(ids.max()) >= vocab_size:
            raise ValueError(f"Token id {int(ids.max())} is outside the vocabulary of {vocab_size} ids.")
        counts += torch.bincount(ids, minlength=vocab_size)
    return counts


def frequent_tokens(counts: torch.Tensor, size: int, always: Iterable[int] = ()) -> torch.Tensor:
    """The `size` most frequent token ids (ties broken by the lower id), always including `always` (e.g. the
    end-of-sequence ids), sorted ascending.

    Args:
        counts (`torch.Tensor` of shape `(vocab,)`): occurrences per id, e.g. from [`count_tokens`].
        size (`int`): how many ids to keep; at most the vocabulary size.
        always: ids kept whatever their count (they count towards `size`).

    Returns:
        `torch.LongTensor` of shape `(size,)`.
    """
    vocab = counts.numel()
    always = sorted({int(i) for i in always})
    if not 0 < size <= vocab:
        raise ValueError(f"A draft vocabulary needs between 1 and {vocab} ids, got {size}.")
    if len(always) > size or any(not 0 <= i < vocab for i in always):
        raise ValueError(f"The ids to keep {always} do not fit a draft vocabulary of {size} of {vocab} ids.")
    score = counts.double().clone()
    score[always] = float("inf")
    # Stable sort on descending counts: among equal counts the lower id (earlier BPE merge) comes first.
    order = torch.sort(-score, stable=True).indices
    return order[:size].sort().values


def vocab_index(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The map from a full vocabulary to a draft vocabulary: `(vocab_size,)`, the position of every id in
    `token_ids`, or -1 for ids outside it."""
    index = torch.full((vocab_size,), -1, dtype=torch.long, device=token_ids.device)
    index[token_ids] = torch.arange(token_ids.numel(), device=token_ids.device)
    return index


def check_token_ids(token_ids: torch.Tensor, vocab_size: int, what: str = "The draft vocabulary") -> torch.Tensor:
    """Validate a draft vocabulary (1-D, unique ids within the vocabulary) and return it as sorted int64."""
    try:
        token_ids = torch.as_tensor(token_ids)
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(f"{what} takes a 1-D tensor or list of token ids, got {type(token_ids).__name__}.") from error
    if token_ids.dim() != 1 or token_ids.numel() == 0:
        raise ValueError(
            f"{what} takes a non-empty 1-D tensor or list of token ids, got shape {tuple(token_ids.shape)}: pass the "
            "ids the draft may propose (e.g. `hf_specdec.drafters.vocab.draft_vocabulary(...)`)."
        )
    if token_ids.is_floating_point() or token_ids.is_complex() or token_ids.dtype == torch.bool:
        raise TypeError(f"{what} takes integer token ids, got {token_ids.dtype}: pass the ids as integers.")
    token_ids = token_ids.long().sort().values
    if int(token_ids[0]) < 0 or int(token_ids[-1]) >= vocab_size:
        raise ValueError(
            f"{what} holds ids outside the model's {vocab_size} logits (0 to {vocab_size - 1}): pass ids of the "
            "models' own tokenizer."
        )
    if bool((token_ids[1:] == token_ids[:-1]).any()):
        raise ValueError(f"{what} holds repeated token ids: pass each id once.")
    return token_ids


def draft_vocabulary(
    tokenizer: PreTrainedTokenizerBase, texts: Iterable[str], size: int, always: Iterable[int] = ()
) -> torch.Tensor:
    """The `size` tokens that `texts` use most (text like what the model will write), with the tokenizer's
    special tokens (end of turn, end of text) always in: a draft vocabulary for `generate(assistant_vocab=)`.

    Example:
        ```python
        vocab = draft_vocabulary(tokenizer, corpus_texts, 32768)
        model.generate(**inputs, assistant=draft, assistant_vocab=vocab)
        ```
    """
    texts = list(texts)
    chunks = (texts[i : i + 256] for i in range(0, len(texts), 256))  # batched: fast tokenizers use every core
    encoded = (ids for chunk in chunks for ids in tokenizer(chunk, add_special_tokens=False)["input_ids"])
    counts = count_tokens(encoded, len(tokenizer))
    return frequent_tokens(counts, size, [*always, *tokenizer.all_special_ids])


class VocabularyRows:
    """An output projection's rows for a draft vocabulary, gathered (and cast) once: again only when the
    weights change in place or are replaced, or another vocabulary or dtype is asked for; at every call while
    the weights train. One instance serves one projection (Medusa heads, or a draft model across calls)."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._ids: torch.Tensor | None = None
        self._rows: tuple[torch.Tensor, torch.Tensor | None] | None = None

    def __getstate__(self) -> dict:
        return {"_key": None, "_ids": None, "_rows": None}  # a copy starts empty (weak references do not pickle)

    def __call__(
        self, lm_head: nn.Module, token_ids: torch.Tensor | None, dtype: torch.dtype | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`(weight, bias)` of `lm_head` restricted to `token_ids` (all rows when `None`), in `dtype` (default:
        the weights' own)."""
        weight, bias = getattr(lm_head, "weight", None), getattr(lm_head, "bias", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.device.type == "meta":
            raise ValueError(
                f"A draft vocabulary (`assistant_vocab`, or heads' `token_ids`) gathers rows of the output layer's "
                f"weight, but {type(lm_head).__name__} keeps none as a loaded 2-D tensor (quantised, offloaded or "
                "not linear). Drop the draft vocabulary, or use a draft whose lm_head is a plain Linear layer."
            )
        ids = None if token_ids is None else token_ids.to(weight.device)
        dtype = weight.dtype if dtype is None else dtype

        def gather(tensor: torch.Tensor) -> torch.Tensor:
            return (tensor if ids is None else tensor[ids]).to(dtype)

        if weight.requires_grad and torch.is_grad_enabled():
            return gather(weight), None if bias is None else gather(bias)
        key = (weight._version, dtype)
        cached = self._rows is not None and self._key is not None and self._key[0]() is weight
        if not (cached and self._key[1:] == key and _same_ids(self._ids, ids)):
            self._key, self._ids = (weakref.ref(weight), *key), None if ids is None else ids.clone()
            self._rows = gather(weight.detach()), None if bias is None else gather(bias.detach())
        assert self._rows is not None
        return self._rows


def _same_ids(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and bool(torch.equal(a, b))
