"""Training data for Medusa heads, loaded with `datasets` and tokenised with the loss on the right tokens.

Accepted records (JSON/JSONL/parquet files or a Hub data set):

- ShareGPT: `{"conversations": [{"from": "human" | "gpt" | "system", "value": ...}, ...]}`
- messages: `{"messages": [{"role": "user" | "assistant" | "system", "content": ...}, ...]}`
- plain text: `{"text": ...}`

Other column names are set with `messages_column` (turns in either form) and `text_column`.

Conversations are rendered with the tokenizer's chat template and only assistant tokens carry labels (the
heads learn to predict the model's replies, not the prompts); plain text is labelled throughout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import datasets
from transformers import PreTrainedTokenizerBase

from hf_specdec.medusa.loss import IGNORE_INDEX

_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
_FILE_TYPES = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "text"}


def load_records(data: str, split: str = "train") -> datasets.Dataset:
    """Load a data set: local files (a path, a comma-separated list, or a folder of files of one type), a local
    data set repository (a folder with a `data/` folder or a `README.md`, laid out as on the Hub), or a Hub
    name. `split` picks the split of a repository or Hub data set (e.g. `train_sft`); plain files are one
    split, `train`."""
    paths = [Path(p) for p in data.split(",")]
    if len(paths) == 1 and paths[0].is_dir() and ((paths[0] / "data").is_dir() or (paths[0] / "README.md").exists()):
        return datasets.load_dataset(str(paths[0]), split=split)
    if all(p.exists() for p in paths):
        if split != "train":
            raise ValueError(f"Data files hold one split, train; --dataset_split {split} needs a data set repository.")
        files = [f for p in paths for f in (sorted(p.iterdir()) if p.is_dir() else [p])]
        kinds = {_FILE_TYPES.get(f.suffix) for f in files}
        if len(kinds) != 1 or None in kinds:
            raise ValueError(
                f"Data files must share one of the types {sorted(_FILE_TYPES)}; got {[f.name for f in files]}."
            )
        return datasets.load_dataset(kinds.pop(), data_files=[str(f) for f in files], split="train")
    return datasets.load_dataset(data, split=split)


def to_messages(
    record: dict[str, Any], messages_column: str | None = None, text_column: str = "text"
) -> list[dict[str, str]] | None:
    """A record's conversation as chat messages, or `None` for a plain-text record (its `text_column`).

    The conversation is `messages_column` when given (turns with `role`/`content` or ShareGPT's `from`/`value`),
    else `messages`, else `conversations`."""
    if messages_column is not None:
        if record.get(messages_column) is None:
            raise ValueError(f"A record has no conversation in {messages_column!r}; its keys are {sorted(record)}.")
        return [_message(turn) for turn in record[messages_column]]
    if record.get("messages"):
        return [_message(m) for m in record["messages"]]
    if record.get("conversations"):
        return [_message(turn) for turn in record["conversations"]]
    if text_column in record:
        return None
    raise ValueError(f"A record needs `messages`, `conversations` or `{text_column}`; got keys {sorted(record)}.")


def _message(turn: dict[str, str]) -> dict[str, str]:
    """One turn as a chat message: `role`/`content` kept, ShareGPT's `from`/`value` mapped."""
    if "role" in turn:
        return {"role": turn["role"], "content": turn["content"]}
    role = _SHAREGPT_ROLES.get(turn.get("from", ""))
    if role is None:
        raise ValueError(f"Unknown ShareGPT speaker {turn.get('from')!r}; expected one of {sorted(_SHAREGPT_ROLES)}.")
    return {"role": role, "content": turn["value"]}


def tokenize_conversation(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], max_length: int
) -> dict[str, list[int]]:
    """Token ids of a rendered conversation and labels that are the ids on assistant tokens, `IGNORE_INDEX`
    elsewhere. Each assistant reply's span is where the rendering with that reply extends the rendering of
    the conversation before it (with the generation prompt)."""
    if not tokenizer.chat_template:
        raise ValueError("Conversation data needs a tokenizer with a chat template; or pass plain `text` records.")
    ids = _render(tokenizer, messages, add_generation_prompt=False)
    labels = [IGNORE_INDEX] * len(ids)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(_render(tokenizer, messages[:i], add_generation_prompt=True))
        end = len(_render(tokenizer, messages[: i + 1], add_generation_prompt=False))
        labels[start:end] = ids[start:end]
    return {"input_ids": ids[:max_length], "labels": labels[:max_length]}


def _render(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], add_generation_prompt: bool
) -> list[int]:
    if not messages:
        return []
    rendered = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)
    return list(rendered["input_ids"] if isinstance(rendered, dict) or hasattr(rendered, "keys") else rendered)


def tokenize_records(
    records: datasets.Dataset,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int = 1024,
    messages_column: str | None = None,
    text_column: str = "text",
) -> datasets.Dataset:
    """Tokenise a data set of conversations or texts (see [`to_messages`] for the columns read); examples
    without any labelled token are dropped."""

    def tokenize(record: dict[str, Any]) -> dict[str, list[int]]:
        messages = to_messages(record, messages_column, text_column)
        if messages is None:
            ids = tokenizer(record[text_column], truncation=True, max_length=max_length)["input_ids"]
            return {"input_ids": ids, "labels": list(ids)}
        return tokenize_conversation(tokenizer, messages, max_length)

    tokenized = records.map(tokenize, remove_columns=records.column_names, desc="tokenizing")
    return tokenized.filter(lambda example: any(t != IGNORE_INDEX for t in example["labels"]), desc="filtering")
