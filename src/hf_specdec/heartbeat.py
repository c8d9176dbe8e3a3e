"""A line on stderr every few seconds while a long, silent step runs (a model's conversion), so that a wait is
never mistaken for a hang."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator


@contextlib.contextmanager
def heartbeat(what: str, every: float = 20.0) -> Iterator[None]:
    """Print `what` when the block starts, `still <what> (N s)` every `every` seconds while it runs, and how long it
    took when it ends (all on stderr)."""
    start = time.monotonic()
    stop = threading.Event()
    print(f"{what} ...", file=sys.stderr, flush=True)

    def beat() -> None:
        while not stop.wait(every):
            print(f"  still {what} ({time.monotonic() - start:.0f} s)", file=sys.stderr, flush=True)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    print(f"  done {what} ({time.monotonic() - start:.0f} s)", file=sys.stderr, flush=True)
