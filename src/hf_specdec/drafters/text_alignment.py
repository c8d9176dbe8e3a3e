"""A row's text in two tokenizations: the target's committed tokens, and the tokens a draft of another tokenizer
reads the same text as.

The target commits tokens in its own vocabulary; the draft must read that text in its own. Re-encoding the whole
text at every step would cost time growing with the text, so each row keeps an *anchor*: a point of the text
where both tokenizations have a token boundary and spell the same text before it. Only the text after the anchor
(the window, at most a few dozen tokens) is decoded from the target's tokens and re-encoded by the draft's
tokenizer at every step; the draft's cache is rolled back to the longest prefix its tokens share with that
encoding, and fed the rest. Token boundaries that do not line up (a word the target split as "hel" + "lo",
which the draft's tokenizer encodes whole, or the draft's own drafts encoded differently once the text grew) are
thus corrected within the window, and the anchor moves forward once the window is long enough.

Draft tokens become target proposals the other way round: the draft's new text is encoded by the target's
tokenizer after the target's last few tokens (`target_proposal`).

These are host functions over lists of ids; they decide what the draft reads and proposes, never what the target
commits (the target verifies every proposal).
"""

from __future__ import annotations

from typing import Any, NamedTuple

# Target tokens kept after the anchor: re-tokenisation changes only the last word or two, far fewer tokens.
MARGIN = 16
# The anchor moves once the window holds this many target tokens (back to MARGIN).
WINDOW = 2 * MARGIN
# Tokens of context decoded before new tokens, so that a tokenizer that drops the leading space of a decoded
# text (SentencePiece) or merges across the boundary still spells the new text as it reads in context.
CONTEXT = 4
# Boundaries tried, one token apart, when moving an anchor (a boundary inside a multi-byte character or where the
# draft's tokens straddle it is skipped).
ANCHOR_TRIES = 4


class Tokenizers(NamedTuple):
    """The target's and the draft's tokenizers (transformers tokenizers, or anything with their `encode`,
    `decode`, `get_vocab` and `convert_ids_to_tokens`)."""

    target: Any
    draft: Any


def decode(tokenizer: Any, ids: list[int]) -> str:
    """The text of `ids`, special tokens and spaces as they are (no clean-up, which would not concatenate)."""
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) if ids else ""


def encode(tokenizer: Any, text: str) -> list[int]:
    """The ids of `text`, without the special tokens a tokenizer adds around a whole input."""
    return tokenizer.encode(text, add_special_tokens=False) if text else []


def common_prefix(a: list[int], b: list[int]) -> int:
    """The length of the longest common prefix of two lists."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def continuation(tokenizer: Any, context: list[int], new: list[int]) -> str:
    """The text `new` adds after `context` (both ids of `tokenizer`), without a trailing incomplete character."""
    before = decode(tokenizer, context)
    after = decode(tokenizer, context + new)
    text = after[len(before) :] if after.startswith(before) else decode(tokenizer, new)
    return text.rstrip("\ufffd")


def target_proposal(
    tokenizers: Tokenizers, target_ids: list[int], draft_context: list[int], drafted: list[int]
) -> list[int]:
    """The target tokens that spell the text of the draft's tokens `drafted` after the committed `target_ids`.

    The text is encoded after the target's last `CONTEXT` tokens, so that it is split as the target's tokenizer
    splits it in context; where that encoding does not keep those tokens as they were committed (the new text
    merges with the last committed token), the new text is encoded alone.

    Args:
        tokenizers (`Tokenizers`): both tokenizers.
        target_ids (`list[int]`): the row's committed target tokens.
        draft_context (`list[int]`): the draft tokens just before `drafted` (a few suffice).
        drafted (`list[int]`): the draft's new tokens.
    """
    text = continuation(tokenizers.draft, draft_context, drafted)
    if not text:
        return []
    context = target_ids[-CONTEXT:]
    ids = encode(tokenizers.target, decode(tokenizers.target, context) + text)
    if ids[: len(context)] == context:
        return ids[len(context) :]
    return encode(tokenizers.target, text)


class RowAlignment:
    """One row's text as the draft reads it, and the draft tokens its cache holds.

    Invariant: the draft's first `anchor_draft` tokens spell the text of the target's first `anchor_target`
    committed tokens; the draft's tokens after them are its tokenizer's encoding of the rest of the committed
    text (the window) as of the last `sync`, then the drafts it was fed since.

    Args:
        tokenizers (`Tokenizers`): both tokenizers.
        fallback_id (`int`): the draft token to read when the text encodes to no draft token at all.
    """

    def __init__(self, tokenizers: Tokenizers, fallback_id: int) -> None:
        self.tokenizers = tokenizers
        self.fallback_id = fallback_id
        self.anchor_target = 0
        self.anchor_draft = 0
        self.draft_ids: list[int] = []  # the tokens the draft's cache holds for the row, in order

    def sync(self, target_ids: list[int]) -> tuple[int, list[int]]:
        """Bring the draft's tokens in step with the committed `target_ids`.

        Returns:
            `(keep, feed)`: the draft keeps its first `keep` tokens and is fed `feed` after them (at least one
            token, so that the draft has logits to draft from).
        """
        target, draft = self.tokenizers
        start = self.anchor_target
        window = continuation(target, target_ids[max(start - CONTEXT, 0) : start], target_ids[start:])
        desired = self.draft_ids[: self.anchor_draft] + encode(draft, window)
        if not desired:
            desired = [self.fallback_id]
        shared = self.anchor_draft + common_prefix(self.draft_ids[self.anchor_draft :], desired[self.anchor_draft :])
        keep = min(shared, len(desired) - 1)
        self.draft_ids = desired
        self._advance(target_ids, window)
        return keep, desired[keep:]

    def fed(self, ids: list[int]) -> None:
        """Record drafted tokens the draft was fed after its last `sync`."""
        self.draft_ids.extend(ids)

    def _advance(self, target_ids: list[int], window: str) -> None:
        """Move the anchor to `MARGIN` tokens before the end once the window holds `WINDOW` target tokens, at
        the first boundary (going back) where both tokenizations split the window's text in the same two parts."""
        start = self.anchor_target
        if len(target_ids) - start < WINDOW:
            return
        target, draft = self.tokenizers
        context = self.draft_ids[max(self.anchor_draft - CONTEXT, 0) : self.anchor_draft]
        tail = self.draft_ids[self.anchor_draft :]
        for split in range(len(target_ids) - MARGIN, len(target_ids) - MARGIN - ANCHOR_TRIES, -1):
            left = continuation(target, target_ids[max(start - CONTEXT, 0) : start], target_ids[start:split])
            right = continuation(target, target_ids[split - CONTEXT : split], target_ids[split:])
            if left + right != window:
                continue  # the text does not split here (a split character, say)
            cut = draft_boundary(draft, context, tail, left)
            if cut is None or continuation(draft, (context + tail[:cut])[-CONTEXT:], tail[cut:]) != right:
                continue
            self.anchor_target = split
            self.anchor_draft += cut
            return


def draft_boundary(tokenizer: Any, context: list[int], ids: list[int], text: str) -> int | None:
    """The number of leading `ids` whose text after `context` is exactly `text`, or `None` when no token boundary
    falls there (found by bisection on the text's length, which grows with the number of tokens)."""
    low, high = 0, len(ids)
    while low < high:
        middle = (low + high) // 2
        if len(continuation(tokenizer, context, ids[:middle])) < len(text):
            low = middle + 1
        else:
            high = middle
    return low if continuation(tokenizer, context, ids[:low]) == text else None
