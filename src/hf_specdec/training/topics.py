"""Pick training conversations by topic, so heads can learn the kind of text they will draft.

Heads learn the base's continuations of the text they are trained on; heads trained on general chat guess
less well inside code and arithmetic, where a code model spends most of its tokens. These patterns sort
the opening request of a conversation into `maths` (numbers, calculations, word problems), `code`
(languages, programs, libraries) or neither. They are coarse on purpose: a request that mentions a
calculation counts as maths even when it also asks for a program.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

_MATHS = re.compile(
    r"\b(calculate|solve|how many|how much|equation|probability|percent|percentage|average|total cost|sum of|"
    r"math|integral|derivative|prove)\b|\d+\s*[-+*/x×]\s*\d+",
    re.IGNORECASE,
)
_CODE = re.compile(
    r"```|\b(python|javascript|typescript|function|code|script|sql|java|c\+\+|c#|golang|rust|algorithm|regex|"
    r"implement|bash|html|css|react|api|class|array|list|string|dataframe|pandas)\b",
    re.IGNORECASE,
)
TOPICS = ("maths", "code")


def topic_of(text: str) -> str | None:
    """`"maths"`, `"code"` or `None` for a request (maths wins when both match)."""
    if _MATHS.search(text):
        return "maths"
    if _CODE.search(text):
        return "code"
    return None


def select_conversations(
    records: Iterable[dict],
    n: int,
    max_prompt_chars: int,
    topics: Iterable[str] | None = None,
    min_ascii: float = 0.0,
    min_prompt_chars: int = 0,
) -> Iterator[dict]:
    """The first `n` ShareGPT records (`{"id", "conversations"}`) that open with a human turn of
    `min_prompt_chars` to `max_prompt_chars` characters, in one of `topics` (any when `None`), with at least
    a `min_ascii` share of ASCII characters (0.97 keeps mostly English requests); each cut to its first
    exchange.

    Raises:
        `ValueError`: for an unknown topic.
    """
    wanted = None if topics is None else set(topics)
    if wanted is not None and (unknown := wanted - set(TOPICS)):
        raise ValueError(f"Unknown topics {sorted(unknown)}; choose from {list(TOPICS)}.")
    written = 0
    for record in records:
        if written == n:
            return
        turns = record.get("conversations") or []
        if len(turns) < 2 or turns[0].get("from") != "human":
            continue
        opening = turns[0].get("value", "")
        if not min_prompt_chars <= len(opening) <= max_prompt_chars:
            continue
        if sum(c.isascii() for c in opening) < min_ascii * len(opening):
            continue
        if wanted is not None and topic_of(opening) not in wanted:
            continue
        written += 1
        yield {"id": record.get("id"), "conversations": turns[:2]}
