"""Greedy identity and speed of a draft model of another tokenizer on real models, against plain greedy decoding
and transformers' own universal assisted generation (`assistant_model=` with both tokenizers).

Usage, from the repository root (the zoo's models, bf16, batch size 1, the benchmark's default prompt categories):

    python tools/other_tokenizer_check.py                       # 3 prompts, identity only
    python tools/other_tokenizer_check.py --n 6 --time          # warm up, then time the three methods interleaved
    python tools/other_tokenizer_check.py --n 8 --batch 4 --time  # batches of 4 (transformers takes batch size 1 only)

For every prompt it prints whether our output and transformers' equal plain greedy's token for token and, where
one does not, the first differing position and the target's logit gap there between plain greedy's token and the
other (bf16 rounds a forward over several tokens differently from single-token forwards: a gap within about 0.25
is rounding, a larger one a bug).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch

import hf_specdec
from hf_specdec.bench.prompts import chat_inputs, load_prompts
from hf_specdec.zoo import load_model


def logit_gap(target: torch.nn.Module, plain: torch.Tensor, other: torch.Tensor, width: int) -> str:
    """Where `other` `(length,)` first leaves `plain` `(length,)` after the prompt, and the target's logit gap
    there between plain's token and other's; "same" when they agree."""
    length = min(plain.shape[0], other.shape[0])
    differ = (plain[width:length] != other[width:length]).nonzero()
    if not len(differ):
        return "same" if plain.shape == other.shape else f"lengths {plain.shape[0]} and {other.shape[0]}"
    i = width + int(differ[0])
    with torch.no_grad():
        logits = target(plain[None, :i]).logits[0, -1].float()
    return f"token {i - width}: gap {float(logits[plain[i]] - logits[other[i]]):.3f}"


def run(name: str, method: Callable[[dict], Any], inputs: dict) -> Any:
    """`method(inputs)`, or `None` where it raised a `RuntimeError` (transformers' own path fails on some prompts)."""
    try:
        return method(inputs)
    except RuntimeError as error:
        print(f"    {name} failed: {str(error)[:100]}", flush=True)
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="smollm2-135m")
    parser.add_argument("--n", type=int, default=3, help="prompts")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1, help="prompts per call (transformers' path: 1 only)")
    parser.add_argument("--time", action="store_true", help="warm up, then time the methods interleaved")
    args = parser.parse_args()
    target, target_tokenizer = load_model(args.target, dtype=torch.bfloat16)
    draft, draft_tokenizer = load_model(args.draft, dtype=torch.bfloat16)
    target = hf_specdec.speculative(target)
    tokenizers = {"tokenizer": target_tokenizer, "assistant_tokenizer": draft_tokenizer}
    settings = {"max_new_tokens": args.max_new_tokens, "do_sample": False, **tokenizers}
    methods: dict[str, Callable[[dict], Any]] = {
        "plain": lambda inputs: target.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False),
        "ours": lambda inputs: target.generate(**inputs, **settings, assistant=draft, return_dict_in_generate=True),
        "transformers": lambda inputs: target.generate(**inputs, **settings, assistant_model=draft),
    }
    if args.batch > 1:
        del methods["transformers"]  # "assisted generate is only supported for batch_size = 1"
    prompts = load_prompts(["mt-bench", "humaneval", "gsm8k"], args.n, seed=0)
    groups = [prompts[i : i + args.batch] for i in range(0, len(prompts), args.batch)]
    batches = [chat_inputs(target_tokenizer, [prompt.text for prompt in group]) for group in groups]
    if args.time:  # warm up every method (on the last prompt: the first may be one transformers fails on)
        for name, method in methods.items():
            run(name, method, batches[-1])
    seconds = dict.fromkeys(methods, 0.0)
    tokens = dict.fromkeys(methods, 0)
    for group, inputs in zip(groups, batches, strict=True):
        width = inputs["input_ids"].shape[1]
        outputs: dict[str, Any] = {}
        times: dict[str, float] = {}
        for name, method in methods.items():  # interleaved prompt by prompt
            start = time.perf_counter()
            output = run(name, method, inputs)
            if output is not None:
                outputs[name], times[name] = output, time.perf_counter() - start
        if len(outputs) == len(methods):  # speeds over the prompts every method decoded
            for name, output in outputs.items():
                seconds[name] += times[name]
                sequences = output.sequences if name == "ours" else output
                tokens[name] += (sequences.shape[1] - width) * sequences.shape[0]
        stats = outputs["ours"].speculative.summary()
        outputs["ours"] = outputs["ours"].sequences
        counts = {key: round(stats[key], 2) for key in ("tau", "acceptance_rate", "plain_steps")}
        for row, prompt in enumerate(group):
            start = int((inputs["attention_mask"][row] == 0).sum())  # left padding
            plain = outputs["plain"][row, start:]
            checks = {
                name: logit_gap(target, plain, out[row, start:], width - start)
                for name, out in outputs.items()
                if name != "plain"
            }
            print(f"{prompt.category:10s} {prompt.source_id:24s} {checks} {counts}", flush=True)
        print("    seconds:", {name: round(value, 1) for name, value in times.items()}, flush=True)
    if args.time:
        if not all(seconds.values()):
            print("no prompt that every method decoded: no speeds")
            return
        rates = {name: tokens[name] / seconds[name] for name in methods}
        print("tokens/s over the prompts every method decoded:", {name: round(rate, 2) for name, rate in rates.items()})
        print("ours / plain:", round(rates["ours"] / rates["plain"], 3))
        if "transformers" in rates:
            print("ours / transformers:", round(rates["ours"] / rates["transformers"], 3))


if __name__ == "__main__":
    main()
