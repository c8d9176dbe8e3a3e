"""The tokens a draft's tokenizer shares with the target's: the same string in both vocabularies.

A draft of another tokenizer samples lossless proposals only among these tokens (Timor et al. 2025, "Lossless
Speculative Decoding Algorithms for Heterogeneous Vocabularies"): its distribution restricted to them and
renormalised is a distribution q over target ids, from which a proposal is drawn and against which the target
accepts it (see `hf_specdec.drafters.translated`).

Token strings are compared as the vocabularies spell them (`get_vocab()`), after writing the draft's
word-start marker as the target's where the two differ (SentencePiece's "▁" against byte-level BPE's "Ġ").
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import torch


@dataclasses.dataclass(frozen=True)
class SharedVocabulary:
    """A one-to-one map between the draft ids and the target ids of the tokens both tokenizers spell the same.

    Attributes:
        draft_to_target (`torch.LongTensor` of shape `(draft_vocab,)`): each draft id's target id, -1 where the
            target has no such token (or the target scores no such id).
        target_to_draft (`torch.LongTensor` of shape `(target_vocab,)`): the inverse, -1 where none.
    """

    draft_to_target: torch.Tensor
    target_to_draft: torch.Tensor

    @property
    def size(self) -> int:
        """How many tokens the two vocabularies share."""
        return int((self.draft_to_target >= 0).sum())

    def to(self, device: torch.device) -> SharedVocabulary:
        return SharedVocabulary(self.draft_to_target.to(device), self.target_to_draft.to(device))

    def target_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """Draft logits `(..., draft_vocab)` as logits over the target's ids `(..., target_vocab)`: each shared
        token's logit at its target id, -inf at every other id (a softmax of them is the draft's distribution
        restricted to the shared tokens, renormalised)."""
        draft_logits = draft_logits[..., : self.draft_to_target.shape[0]]
        shared = (self.draft_to_target[: draft_logits.shape[-1]] >= 0).nonzero(as_tuple=True)[0]  # (S,)
        shape = (*draft_logits.shape[:-1], self.target_to_draft.shape[0])
        logits = draft_logits.new_full(shape, float("-inf"))
        return logits.index_copy_(-1, self.draft_to_target[shared], draft_logits.index_select(-1, shared))


def word_start_marker(tokenizer: Any) -> str | None:
    """The character a tokenizer's vocabulary writes for a leading space ("Ġ", "▁"), read from how it encodes
    " a"; `None` when that is not one marker character before the letter."""
    tokens = tokenizer.convert_ids_to_tokens(tokenizer.encode(" a", add_special_tokens=False))
    first = tokens[0] if tokens else ""
    if (len(first) == 2 and first.endswith("a")) or (len(first) == 1 and first != "a"):  # "Ġa", or "Ġ" then "a"
        return first[0]
    return None


def build_shared_vocabulary(
    target_tokenizer: Any, draft_tokenizer: Any, target_vocab_size: int, draft_vocab_size: int
) -> SharedVocabulary:
    """The `SharedVocabulary` of two tokenizers, for models scoring `target_vocab_size` and `draft_vocab_size`
    ids. Where two draft tokens would spell one target token (after rewriting the word-start marker), the
    lower draft id keeps it, so that the map stays one-to-one."""
    target_vocab = target_tokenizer.get_vocab()
    theirs, mine = word_start_marker(draft_tokenizer), word_start_marker(target_tokenizer)
    draft_to_target = torch.full((draft_vocab_size,), -1, dtype=torch.long)
    target_to_draft = torch.full((target_vocab_size,), -1, dtype=torch.long)
    for token, draft_id in sorted(draft_tokenizer.get_vocab().items(), key=lambda item: item[1]):
        if theirs is not None and mine is not None and theirs != mine and token.startswith(theirs):
            token = mine + token[1:]
        target_id = target_vocab.get(token)
        if target_id is None or draft_id >= draft_vocab_size or target_id >= target_vocab_size:
            continue
        if target_to_draft[target_id] < 0:
            draft_to_target[draft_id] = target_id
            target_to_draft[target_id] = draft_id
    return SharedVocabulary(draft_to_target, target_to_draft)


# Built once per pair of tokenizers and sizes (walking a vocabulary of 150k tokens takes a noticeable fraction of a
# second), kept as long as both tokenizers live.
_BUILT: weakref.WeakKeyDictionary[Any, weakref.WeakKeyDictionary[Any, dict[tuple[int, int], SharedVocabulary]]] = (
    weakref.WeakKeyDictionary()
)


def shared_vocabulary(
    target_tokenizer: Any, draft_tokenizer: Any, target_vocab_size: int, draft_vocab_size: int
) -> SharedVocabulary:
    """`build_shared_vocabulary`, remembered for the pair of tokenizers and sizes."""
    try:
        built = _BUILT.setdefault(draft_tokenizer, weakref.WeakKeyDictionary()).setdefault(target_tokenizer, {})
    except TypeError:  # a tokenizer that cannot be weakly referenced: built every time
        return build_shared_vocabulary(target_tokenizer, draft_tokenizer, target_vocab_size, draft_vocab_size)
    key = (target_vocab_size, draft_vocab_size)
    if key not in built:
        built[key] = build_shared_vocabulary(target_tokenizer, draft_tokenizer, target_vocab_size, draft_vocab_size)
    return built[key]
