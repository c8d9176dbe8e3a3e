"""Self-distillation data: the base model writes the replies its heads will learn to predict.

Heads trained on the base's own outputs learn the base's distribution, which is what they must guess at
decoding time, even when no chat data in the base's style exists. Generation is batched (prompts of similar
length together, so little of a batch is padding), shows a progress bar, and appends to a JSONL file as it
goes, so an interrupted run resumes where it stopped.

With `generate_kwargs` (`{"assistant": draft}`, `{"prompt_lookup_num_tokens": 10}`, any argument of the library's
`generate()`), the replies are written by the library's speculative decoding: the same greedy replies (token for
token in float32), sooner where drafting pays; `--dry_run` times both ways on one batch.

Under `accelerate launch` / `torchrun`, the batches are split between the processes
(`PartialState.split_between_processes`), each on its own device: N processes generate N times as fast, the
batches are the ones a single process makes (so the records are the same), and every process returns the whole
data set once all have finished.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import datasets
import torch
from accelerate import PartialState
from tqdm.auto import tqdm
from transformers import BatchEncoding, PreTrainedModel, PreTrainedTokenizerBase

from hf_specdec.api.entry import speculative_generate
from hf_specdec.generation.validation import eos_token_ids
from hf_specdec.medusa.loss import IGNORE_INDEX
from hf_specdec.training.data import to_messages
from hf_specdec.training.hidden_cache import numpy_states
from hf_specdec.training.processes import main_process_value


def prompt_messages(record: dict[str, Any], messages_column: str | None = None) -> list[dict[str, str]] | None:
    """The conversation up to (not including) its first assistant reply; `None` if there is no user turn."""
    messages = to_messages(record, messages_column)
    if messages is None:
        return None
    prompt = []
    for message in messages:
        if message["role"] == "assistant":
            break
        prompt.append(message)
    return prompt if any(m["role"] == "user" for m in prompt) else None


def prompt_text(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]) -> str:
    """A prompt rendered with the chat template, up to the assistant's turn."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def by_prompt_length(
    tokenizer: PreTrainedTokenizerBase, todo: list[tuple[int, list[dict[str, str]]]]
) -> list[tuple[int, list[dict[str, str]]]]:
    """`(index, prompt)` pairs, longest rendered prompt first, so a batch pads to prompts of about its own rows'
    length: prefill costs what its padded tokens cost, and in a batch of 32 ShareGPT openings in corpus order
    nearly three quarters of them are padding. Longest first also finds a batch too big for memory at once.
    Callers give the results back in corpus order."""
    texts = [prompt_text(tokenizer, m) for _, m in todo]
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []
    order = sorted(range(len(todo)), key=lambda i: (-lengths[i], todo[i][0]))
    return [todo[i] for i in order]


def prompt_batch(
    tokenizer: PreTrainedTokenizerBase, prompts: list[list[dict[str, str]]], device: torch.device
) -> BatchEncoding:
    """Prompts rendered with the chat template up to the assistant's turn, left-padded (the caller sets
    the tokenizer's padding side)."""
    texts = [prompt_text(tokenizer, m) for m in prompts]
    return tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)


def generate_replies(
    base: PreTrainedModel,
    inputs: BatchEncoding,
    max_new_tokens: int,
    pad_token_id: int | None,
    generate_kwargs: dict[str, Any] | None = None,
    **sampling: Any,
) -> torch.Tensor:
    """The base's continuations of a left-padded batch `(batch, prompt + new)`: plain `generate()`, or the library's
    speculative `generate()` with `generate_kwargs` (its speculative arguments)."""
    settings = dict(max_new_tokens=max_new_tokens, pad_token_id=pad_token_id, **sampling)
    if generate_kwargs:
        return speculative_generate(base, **inputs, **settings, **generate_kwargs)
    return base.generate(**inputs, **settings)


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
    messages_column: str | None = None,
    generate_kwargs: dict[str, Any] | None = None,
) -> datasets.Dataset:
    """Replace every conversation's first reply by the base's own, written to `output_file` (JSONL, `messages`
    format) and returned as a data set. Records already written are not generated again.

    With several processes, process i appends to `<stem>.rank<i>.jsonl` beside `output_file` (all of them are
    read back, and read to resume, whatever the number of processes of the run that wrote them).

    Args:
        base, tokenizer: the model whose replies the heads will learn (the tokenizer needs a chat template).
        records (`datasets.Dataset`): ShareGPT or `messages` records; those without a user turn are skipped.
        output_file: where replies are appended; keep it to resume an interrupted run.
        max_new_tokens, batch_size, do_sample, temperature: generation settings (greedy by default, which is
            what heads serving greedy decoding should learn).
        messages_column: the column holding the conversations (see `to_messages`).
        generate_kwargs (`dict`, *optional*): speculative arguments of the library's `generate()` to write the
            replies with (e.g. `{"assistant": draft_model}`): the same replies, sooner where drafting pays.
    """
    state = PartialState()
    output_file = Path(output_file)
    lines = [line for part in _jsonl_parts(output_file) for line in part.read_text().splitlines() if line.strip()]
    done = {json.loads(line)["id"] for line in lines}
    todo = [
        (i, m)
        for i, r in enumerate(records)
        if i not in done and (m := prompt_messages(r, messages_column)) is not None
    ]
    todo = by_prompt_length(tokenizer, todo)
    batches = [todo[start : start + batch_size] for start in range(0, len(todo), batch_size)]
    sink_file = output_file
    if state.num_processes > 1:
        sink_file = output_file.with_name(f"{output_file.stem}.rank{state.process_index}{output_file.suffix}")
    state.wait_for_everyone()  # every process has read what was done before any writes
    output_file.parent.mkdir(parents=True, exist_ok=True)
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"
    sampling = {"do_sample": True, "temperature": temperature} if do_sample else {"do_sample": False}
    try:
        with state.split_between_processes(batches) as mine, sink_file.open("a") as sink:
            for batch in tqdm(mine, desc="self-distillation", unit="batch", disable=not state.is_local_main_process):
                inputs = prompt_batch(tokenizer, [m for _, m in batch], base.device)
                out = generate_replies(
                    base, inputs, max_new_tokens, tokenizer.pad_token_id, generate_kwargs, **sampling
                )
                replies = tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
                for (index, messages), reply in zip(batch, replies, strict=True):
                    record = {"id": index, "messages": [*messages, {"role": "assistant", "content": reply.strip()}]}
                    sink.write(json.dumps(record) + "\n")
                sink.flush()
    finally:
        tokenizer.padding_side = padding_side
    state.wait_for_everyone()
    # In corpus order whatever order the batches ran in, so a data split by position is the same as ever.
    files = [str(part) for part in _jsonl_parts(output_file)]
    with state.main_process_first():
        return datasets.load_dataset("json", data_files=files, split="train").sort("id")


def _jsonl_parts(output_file: Path) -> list[Path]:
    """`output_file` and the files processes of a distributed run wrote beside it, those that exist."""
    parts = [output_file, *sorted(output_file.parent.glob(f"{output_file.stem}.rank*{output_file.suffix}"))]
    return [part for part in parts if part.exists() and part.stat().st_size]


@torch.no_grad()
def self_distill_with_states(
    base: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    records: datasets.Dataset,
    directory: str | Path,
    max_new_tokens: int = 256,
    batch_size: int = 8,
    max_length: int | None = None,
    messages_column: str | None = None,
    layers: tuple[int, ...] = (-1,),
) -> datasets.Dataset:
    """Self-distillation that keeps the base's last hidden states from its own generation, so Medusa-1 heads
    train without a second forward over the replies. `layers` chooses other hidden states (indices of
    `output_hidden_states`), concatenated in that order (EAGLE-3 heads: `SequenceHeads.state_layers`).

    Returns (and saves under `directory`, one shard per batch, so an interrupted run resumes) a data set with
    `input_ids` (the prompt rendered with the chat template, then the reply exactly as the base wrote it,
    end-of-turn token included), `labels` (the reply's tokens; prompt tokens ignored) and `hidden_states`
    `(seq, hidden)` float16 (the base's last hidden states, after its final norm; zero at the last token, whose
    state no label needs). Greedy, as heads serving greedy decoding should learn.
    """
    todo = [(i, m) for i, r in enumerate(records) if (m := prompt_messages(r, messages_column)) is not None]
    if not todo:
        raise ValueError("No record has a user turn to reply to: nothing to self-distill.")
    todo = by_prompt_length(tokenizer, todo)
    # Shards are reused only by a run with the same base, data and settings (and batches made the same way).
    settings = [base.name_or_path, str(base.dtype), records._fingerprint, max_new_tokens, batch_size, max_length]
    settings.append("longest-first")
    settings.append(getattr(tokenizer, "chat_template", None))
    if layers != (-1,):
        settings.append(list(layers))
    name = main_process_value(hashlib.sha256(json.dumps(settings, default=str).encode()).hexdigest()[:16])
    directory = Path(directory) / name
    width = len(layers) * base.config.get_text_config(decoder=True).hidden_size
    features = datasets.Features(
        {
            "input_ids": datasets.Sequence(datasets.Value("int64")),
            "labels": datasets.Sequence(datasets.Value("int64")),
            "hidden_states": datasets.Array2D(shape=(None, width), dtype="float16"),
        }
    )
    eos_ids = torch.tensor(eos_token_ids(base), dtype=torch.long)
    state = PartialState()
    starts = list(range(0, len(todo), batch_size))
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        with state.split_between_processes(starts) as mine:
            for start in tqdm(mine, desc="self-distillation", unit="batch", disable=not state.is_local_main_process):
                shard = directory / f"shard-{start:07d}"
                if (shard / "dataset_info.json").exists():
                    continue
                batch = todo[start : start + batch_size]
                inputs = prompt_batch(tokenizer, [m for _, m in batch], base.device)
                out = base.generate(
                    **inputs,
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    pad_token_id=tokenizer.pad_token_id,
                    output_hidden_states=True,
                    return_dict_in_generate=True,
                    prefill_chunk_size=None,  # the first step's states must cover the whole prompt
                )
                rows = _rows_with_states(inputs["attention_mask"], out.sequences, out.hidden_states, eos_ids, layers)
                if max_length is not None:
                    rows = [{k: v[:max_length] for k, v in row.items()} for row in rows]
                datasets.Dataset.from_list(rows, features=features).save_to_disk(str(shard))
    finally:
        tokenizer.padding_side = padding_side
    state.wait_for_everyone()  # every shard is written
    shards = [datasets.load_from_disk(str(directory / f"shard-{start:07d}")) for start in starts]
    # Back in corpus order (the shards follow prompt length), so a data split by position is the same as ever.
    generated = [index for index, _ in todo]
    ordered = datasets.concatenate_datasets(shards).select(sorted(range(len(todo)), key=generated.__getitem__))
    return numpy_states(ordered)


def _rows_with_states(
    attention_mask: torch.Tensor,
    sequences: torch.Tensor,
    steps: tuple,
    eos_ids: torch.Tensor,
    layers: tuple[int, ...] = (-1,),
) -> list[dict[str, Any]]:
    """Unpad a generated batch into examples, with the states of `layers` (concatenated) at every fed token."""
    prompt_length = attention_mask.shape[1]
    # steps[0]: the prompt's layers (B, P, H) each; then one (B, 1, H) per layer and generated token fed back.
    per_step = [torch.cat([step[i] for i in layers], dim=-1) for step in steps]
    states = torch.cat(per_step, dim=1)  # (B, P + G - 1, len(layers) * H)
    if states.shape[1] != sequences.shape[1] - 1:
        raise RuntimeError(f"Generation returned {states.shape[1]} states for {sequences.shape[1]} tokens.")
    rows = []
    for b in range(sequences.shape[0]):
        first = int((attention_mask[b] == 0).sum())  # left padding
        generated = sequences[b, prompt_length:]
        is_eos = torch.isin(generated, eos_ids.to(generated.device))
        length = int(is_eos.long().argmax()) + 1 if bool(is_eos.any()) else generated.numel()
        ids = sequences[b, first : prompt_length + length]
        hidden = states[b, first : prompt_length + length - 1].to(torch.float16).cpu()
        hidden = torch.cat([hidden, hidden.new_zeros(1, hidden.shape[1])])  # the last token is never fed
        labels = torch.cat([torch.full((prompt_length - first,), IGNORE_INDEX), generated[:length].cpu()])
        rows.append({"input_ids": ids.tolist(), "labels": labels.tolist(), "hidden_states": hidden.numpy()})
    return rows
