"""Real code for a code model's heads to learn from: the Python source files installed packages ship.

Heads trained teacher-forced on text the base did not write (`--relabel_with_base`, `--soft_targets`) pay one
forward per token instead of a generation, and any machine with Python has megabytes of real, varied code in
its environment: the standard library and every installed package. Files are read in a fixed shuffled order
(sorted paths, shuffled with a fixed seed: the same environment gives the same corpus, and a few thousand chunks
span many packages rather than the first ones in the alphabet), and cut at line ends into chunks of at most
`max_chars` characters, so a chunk fits a training example instead of being truncated.
"""

from __future__ import annotations

import random
import sysconfig
from collections.abc import Iterable, Iterator
from pathlib import Path

MIN_CHUNK_CHARS = 200
"""Chunks shorter than this are dropped by default (a file's tail of a few lines teaches little)."""

SKIPPED_FOLDERS = frozenset({"__pycache__", "site-packages", "dist-packages"})
"""Folders not entered: caches, and the package folders inside the standard library's (listed on their own)."""


def python_roots() -> list[Path]:
    """Where this interpreter's Python code lives: its installed packages (`purelib`, then `platlib` where it
    differs), then the standard library."""
    paths = sysconfig.get_paths()
    roots = [paths["purelib"], paths["platlib"], paths["stdlib"]]
    unique = list(dict.fromkeys(Path(root).resolve() for root in roots))
    return [root for root in unique if root.is_dir()]


def python_files(roots: Iterable[Path]) -> Iterator[tuple[Path, Path]]:
    """`(root, path)` for every `.py` file under `roots`, each file once, in a fixed shuffled order."""
    found: dict[Path, Path] = {}
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            folders = path.relative_to(root).parts[:-1]
            if not SKIPPED_FOLDERS.intersection(folders) and path not in found and path.is_file():
                found[path] = root
    files = list(found.items())
    random.Random(0).shuffle(files)
    for path, root in files:
        yield root, path


def chunks(text: str, max_chars: int) -> Iterator[str]:
    """`text` cut at line ends into pieces of at most `max_chars` characters (a longer line is cut where it
    reaches the limit); pieces of blank lines only are dropped."""
    piece: list[str] = []
    size = 0
    for line in text.splitlines(keepends=True):
        while len(line) > max_chars:
            yield from _nonblank("".join(piece))
            piece, size = [], 0
            yield from _nonblank(line[:max_chars])
            line = line[max_chars:]
        if size + len(line) > max_chars:
            yield from _nonblank("".join(piece))
            piece, size = [], 0
        piece.append(line)
        size += len(line)
    yield from _nonblank("".join(piece))


def _nonblank(text: str) -> Iterator[str]:
    if text.strip():
        yield text


def code_records(
    roots: Iterable[Path], n: int, max_chars: int = 2000, min_chars: int = MIN_CHUNK_CHARS, min_ascii: float = 0.97
) -> Iterator[dict[str, str]]:
    """The first `n` chunks (`{"text", "source"}` records, `source` the file under its root and the chunk's number)
    of the Python files
    under `roots` whose text has at least `min_chars` characters and a `min_ascii` share of ASCII characters;
    unreadable files are skipped.

    Raises:
        `ValueError`: for `n` below 1, `min_chars` above `max_chars`, or `min_ascii` outside [0, 1].
    """
    if n < 1:
        raise ValueError(f"Ask for at least one record, got n={n}.")
    if not 0 < min_chars <= max_chars:
        raise ValueError(f"Chunks of {min_chars} to {max_chars} characters: need 0 < min_chars <= max_chars.")
    if not 0.0 <= min_ascii <= 1.0:
        raise ValueError(f"min_ascii is a share of characters, in [0, 1]; got {min_ascii}.")
    return _records(roots, n, max_chars, min_chars, min_ascii)


def _records(roots: Iterable[Path], n: int, max_chars: int, min_chars: int, min_ascii: float) -> Iterator[dict]:
    written = 0
    for root, path in python_files(roots):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for index, piece in enumerate(chunks(text, max_chars)):
            if len(piece) < min_chars or sum(c.isascii() for c in piece) < min_ascii * len(piece):
                continue
            yield {"text": piece, "source": f"{path.relative_to(root)}#{index}"}
            written += 1
            if written == n:
                return
