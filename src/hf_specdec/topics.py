"""Pick training conversations by topic, so heads can learn the kind of text they will draft.

Heads learn the base's continuations of the text they are trained on; heads trained on general chat guess
less well inside code and arithmetic, where a code model spends most of its tokens. These patterns sort
the opening request of a conversation into `maths` (calculations, word problems, arithmetic written out),
`code` (languages, programs, libraries) or `other` (neither: general chat). They are coarse on purpose: a
request that mentions a calculation counts as maths even when it also asks for a program.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

_MATHS = re.compile(
    r"\b(calculate|solve|how many|how much|equations?|probability|percent|percentage|average|total cost|sum of|"
    r"maths?|mathematics|mathematical|integral|derivative|prove)\b"
    r"|\d+\s*[+*/×÷=]\s*\d+",  # arithmetic written out; not "-" (dates, ranges) nor "x" (sizes)
    re.IGNORECASE,
)
_CODE = re.compile(
    r"```|(?<![\w+#])(c\+\+|c#)(?![\w+#])"
    r"|\b(python|javascript|typescript|function|code|script|sql|java|golang|rust|algorithm|regex|implement|bash|"
    r"html|css|react|api|array|dataframe|pandas|program|programming)\b",
    re.IGNORECASE,
)
TOPICS = ("maths", "code", "other")


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
    whole: bool = False,
) -> Iterator[dict]:
    """The first `n` ShareGPT records (`{"id", "conversations"}`) that open with a human turn of
    `min_prompt_chars` to `max_prompt_chars` characters, in one of `topics` (`maths`, `code`, `other` for neither;
    any when `None`), with at least a `min_ascii` share of ASCII characters (0.97 keeps mostly English requests);
    each cut to its first exchange, or with `whole` kept up to its last reply (every reply real text, which heads
    trained teacher-forced learn from at the cost of one forward). The arguments are checked at once; records
    are read as the result is.

    Raises:
        `ValueError`: for an unknown topic, `n` below 1, an empty length range or `min_ascii` outside [0, 1].
    """
    wanted = None if topics is None else set(topics)
    if wanted is not None and (unknown := wanted - set(TOPICS)):
        raise ValueError(f"Unknown topics {sorted(unknown)}; choose from {list(TOPICS)}.")
    if n < 1:
        raise ValueError(f"Ask for at least one conversation, got n={n}.")
    if min_prompt_chars > max_prompt_chars:
        raise ValueError(f"No opening is {min_prompt_chars} to {max_prompt_chars} characters long: swap them.")
    if not 0.0 <= min_ascii <= 1.0:
        raise ValueError(f"min_ascii is a share of characters, in [0, 1]; got {min_ascii}.")
    return _select(records, n, max_prompt_chars, wanted, min_ascii, min_prompt_chars, whole)


def _select(
    records: Iterable[dict],
    n: int,
    max_chars: int,
    wanted: set[str] | None,
    min_ascii: float,
    min_chars: int,
    whole: bool,
) -> Iterator[dict]:
    written = 0
    for record in records:
        turns = record.get("conversations") or []
        if len(turns) < 2 or turns[0].get("from") != "human":
            continue
        opening = turns[0].get("value", "")
        if not min_chars <= len(opening) <= max_chars:
            continue
        if sum(c.isascii() for c in opening) < min_ascii * len(opening):
            continue
        if wanted is not None and (topic_of(opening) or "other") not in wanted:
            continue
        kept = _exchanges(turns) if whole else turns[:2]
        if not kept:
            continue
        yield {"id": record.get("id"), "conversations": kept}
        written += 1
        if written == n:
            return


def _exchanges(turns: list[dict]) -> list[dict]:
    """The turns up to the last reply, while they alternate human, gpt (ShareGPT V3 has runs of one side and
    empty turns: the conversation stops before the first)."""
    kept: list[dict] = []
    for turn in turns:
        expected = "human" if len(kept) % 2 == 0 else "gpt"
        if turn.get("from") != expected or not turn.get("value"):
            break
        kept.append(turn)
    return kept[: len(kept) // 2 * 2]
