"""Whether a refusal is one docs/refusals.md lists: the fuzzers hold every refusal they meet to the table.

Each row of the page gives a message as the code raised it on tiny models; a refusal met elsewhere raises the same
message with other values in it (numbers, shapes, lists, quoted values, class names, dtypes, the path's name). So
each documented message becomes a pattern in which those values match anything, and a refusal is documented when
its message matches the pattern of a row that lists its path.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from tests.refusal_cases import PATH_NAMES, PATHS

PAGE = Path(__file__).resolve().parent.parent / "docs" / "refusals.md"

# The fuzzers' paths as the page names them; `None`: a path the page does not list (any row's message will do).
PAGE_PATHS: dict[str, str | None] = {
    "assistant": "assistant",
    "assistant_tree": "tree",
    "lookup": "lookup",
    "hybrid": "hybrid",
    "early_exit": None,
    "other_tokenizer": None,
    "medusa": "medusa",
    "medusa_dynamic": "medusa-dynamic",
    "medusa_lookup": "medusa-lookup",
    "mtp": None,
}
# The values a message carries, matched by anything of the same kind (first, the names "all" paths give messages).
_VALUES = re.compile(
    "|".join(
        [
            *(re.escape(name) for name in sorted({PATH_NAMES[path] for path in PATHS})),
            r"\[[^\]]*\]",  # lists
            r"\([^()]*\d[^()]*\)",  # shapes and tuples of numbers
            r"'[^']*'",  # quoted values
            r"torch\.\w+",  # dtypes and devices
            r"\b[A-Za-z][A-Za-z0-9_]*[A-Z][A-Za-z0-9_]*\b",  # class names (Qwen3_5ForCausalLM, xLSTMConfig)
            r"-?\d+(?:\.\d+)?(?:e-?\d+)?",  # numbers
        ]
    )
)


@functools.cache
def documented_patterns() -> tuple[tuple[re.Pattern[str], frozenset[str]], ...]:
    """Every row of the page: the pattern of its message and the paths it lists."""
    rows = []
    for line in PAGE.read_text().splitlines():
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) != 4 or cells[2] not in ("`ValueError`", "`TypeError`"):
            continue
        paths = PATHS if cells[1] == "all" else tuple(path.strip(" `") for path in cells[1].split(","))
        rows.append((_pattern(_unescape(cells[3])), frozenset(paths)))
    if not rows:
        raise RuntimeError(f"No refusal rows found in {PAGE}.")
    return tuple(rows)


def _unescape(cell: str) -> str:
    return re.sub(r"\\([\\*\[\]<|~_`])", r"\1", cell)


def _pattern(message: str) -> re.Pattern[str]:
    """A documented message as a pattern: its fixed text literal, its values (`_VALUES`) matching anything."""
    parts, start = [], 0
    for value in _VALUES.finditer(message):
        parts.append(re.escape(message[start : value.start()]))
        parts.append(".+?")
        start = value.end()
    parts.append(re.escape(message[start:]))
    return re.compile("".join(parts), re.S)


def is_documented(message: str, path: str | None = None) -> bool:
    """Whether `message` is a refusal the page lists, on `path` (a fuzzer's path name; any path when `None` or
    when the page does not list it)."""
    text = " ".join(message.split())
    page_path = PAGE_PATHS.get(path) if path is not None else None
    for pattern, paths in documented_patterns():
        if (page_path is None or page_path in paths) and pattern.fullmatch(text):
            return True
    return False
