"""A streamer fed as plain `generate()` feeds it, whatever each row commits per step.

Plain decoding puts one `(batch,)` tensor per position on the streamer: every row's token at that position, the pad
token for rows that have finished. A speculative step commits several tokens per row, and rows commit different
numbers: `PlainOrderStream` puts a position once every row's token there is final (every running row has reached
it, and no stopping criterion can cut it any more: `TokenBuffer.confirmed`), so a streamer (a `TextStreamer`, a
recording one, one that reads row i as row i) sees the very calls plain decoding makes wherever the tokens are the
same, at any batch size.
"""

from __future__ import annotations

import torch
from transformers.generation.streamers import BaseStreamer

from hf_specdec.generation.sequences import TokenBuffer


class PlainOrderStream:
    """Puts final tokens on `streamer` position by position, `(batch,)` at a time (see the module's docstring).

    Args:
        streamer (`BaseStreamer`): the caller's streamer; rows that have finished get the buffer's pad token.
    """

    def __init__(self, streamer: BaseStreamer) -> None:
        self.streamer = streamer
        self.put_until: int | None = None  # the last position put

    def advance(self, buffer: TokenBuffer, final: bool = False) -> None:
        """Put every position final in `buffer` (all of them with `final`) not put yet, from the host's tokens. With
        criteria called as plain decoding calls them, they put each position right after their call there."""
        if buffer.lockstep is not None:
            return
        done = buffer.prompt_length if self.put_until is None else self.put_until
        until = max(buffer.host_lengths) if final else buffer.confirmed
        for position in range(done + 1, until + 1):
            column = [
                tokens[position - 1] if length >= position else buffer.pad_token_id
                for tokens, length in zip(buffer.host_tokens, buffer.host_lengths, strict=True)
            ]
            self.streamer.put(torch.tensor(column, dtype=torch.long))
        self.put_until = max(done, until)

    def end(self, buffer: TokenBuffer) -> None:
        """Put what is left, then end the streamer."""
        self.advance(buffer, final=True)
        self.streamer.end()
