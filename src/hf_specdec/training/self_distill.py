"""Self-distillation data: the base model writes the replies its heads will learn to predict.

Heads trained on the base's own outputs learn the base's distribution, which is what they must guess at
decoding time, even when no chat data in the base's style exists. Generation is batched, shows a progress
bar, and appends to a JSONL file as it goes, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from hf_specdec.training.data import to_messages


def prompt_messages(record: dict[str, Any]) -> list[dict[str, str]] | None:
    """The conversation up to (not including) its first assistant reply; `None` if there is no user turn."""
    messages = to_messages(record)
    if messages is None:
        return None
    prompt = []
    for message in messages:
        if message["role"] == "assistant":
            break
        prompt.append(message)
    return prompt if any(m["role"] == "user" for m in prompt) else None


@torch.no_grad()
def self_distill(
    base: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    records: datasets.Dataset,
    output_file: str | Path,
    max_new_tokens: int = 256,
    batch_size: int = 8,
    do_sample: bool = False,
    temperature: float = 0.7,
) -> datasets.Dataset:
    """Replace every conversation's first reply by the base's own, written to `output_file` (JSONL, `messages`
    format) and returned as a data set. Records already in the file are not generated again.

    Args:
        base, tokenizer: the model whose replies the heads will learn (the tokenizer needs a chat template).
        records (`datasets.Dataset`): ShareGPT or `messages` records; those without a user turn are skipped.
        output_file: where replies are appended; keep it to resume an interrupted run.
        max_new_tokens, batch_size, do_sample, temperature: generation settings (greedy by default, which is
            what heads serving greedy decoding should learn).
    """
    output_file = Path(output_file)
    done = set()
    if output_file.exists():
        done = {json.loads(line)["id"] for line in output_file.read_text().splitlines() if line.strip()}
    todo = [(i, m) for i, r in enumerate(records) if i not in done and (m := prompt_messages(r)) is not None]
    output_file.parent.mkdir(parents=True, exist_ok=True)
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        with output_file.open("a") as sink:
            for start in tqdm(range(0, len(todo), batch_size), desc="self-distillation", unit="batch"):
                batch = todo[start : start + batch_size]
                texts = [tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for _, m in batch]
                inputs = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(base.device)
                sampling = {"do_sample": True, "temperature": temperature} if do_sample else {"do_sample": False}
                out = base.generate(
                    **inputs, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id, **sampling
                )
                replies = tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
                for (index, messages), reply in zip(batch, replies, strict=True):
                    record = {"id": index, "messages": [*messages, {"role": "assistant", "content": reply.strip()}]}
                    sink.write(json.dumps(record) + "\n")
                sink.flush()
    finally:
        tokenizer.padding_side = padding_side
    return datasets.load_dataset("json", data_files=str(output_file), split="train")
