"""Compare an earlier commit of hf_specdec with the working tree's, in one process, interleaved prompt by prompt.

Speed ratios from two benchmark runs carry the machine's drift between them; here both versions decode the same
prompts on the same model objects within seconds of each other, each against plain `generate()`:

    python tools/ab_versions.py 425227a --n 6 --methods specdec,lookup,hybrid

The old commit's `src/hf_specdec` is exported with `git archive` and imported as `hf_specdec_old`. Prints, per
method, tokens/s and the speedup over plain decoding for each version, and how many outputs equal plain greedy's.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]


def import_old(commit: str, directory: Path) -> ModuleType:
    """The package as it was at `commit`, importable as `hf_specdec_old`."""
    archive = subprocess.run(["git", "archive", commit, "src/hf_specdec"], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(directory)], input=archive.stdout, check=True)
    package = directory / "hf_specdec_old"
    (directory / "src" / "hf_specdec").rename(package)
    for path in package.rglob("*.py"):
        path.write_text(re.sub(r"\bhf_specdec\b", "hf_specdec_old", path.read_text()))
    sys.path.insert(0, str(directory))
    import hf_specdec_old

    return hf_specdec_old


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("commit", help="the earlier commit")
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b")
    parser.add_argument("--n", type=int, default=6, help="prompts (MT-Bench, HumanEval, GSM8K in turn)")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument(
        "--methods", default="specdec,lookup,hybrid", help="of specdec, lookup, hybrid, tree16, tree24-d12"
    )
    args = parser.parse_args()

    import hf_specdec
    from hf_specdec.bench.prompts import chat_inputs, load_prompts
    from hf_specdec.zoo import load_model

    with tempfile.TemporaryDirectory() as directory:
        old = import_old(args.commit, Path(directory))
        target, tokenizer = load_model(args.target, torch.bfloat16)
        draft, _ = load_model(args.draft, torch.bfloat16)
        tokenizer.padding_side = "left"
        base_class = type(target)
        settings: dict[str, Callable[[ModuleType], dict[str, Any]]] = {
            "specdec": lambda _: {"assistant": draft},
            "lookup": lambda _: {"prompt_lookup_num_tokens": 10},
            "hybrid": lambda _: {"assistant": draft, "prompt_lookup_num_tokens": 10},
            "tree16": lambda _: {"assistant": draft, "tree": 16},
            # each version's own DynamicTree class
            "tree24-d12": lambda package: {"assistant": draft, "tree": package.DynamicTree(24, depth=12, top_k=2)},
        }
        runs = [("plain", "-")] + [(m, v) for m in args.methods.split(",") for v in ("old", "new")]
        seconds = dict.fromkeys(runs, 0.0)
        tokens = dict.fromkeys(runs, 0)
        identical = dict.fromkeys(runs, 0)
        prompts = load_prompts(["mt-bench", "humaneval", "gsm8k"], args.n)
        for step, start in enumerate(range(0, args.n, args.batch_size)):
            inputs = chat_inputs(tokenizer, [p.text for p in prompts[start : start + args.batch_size]])
            order = runs[step % len(runs) :] + runs[: step % len(runs)]  # rotate, so drift hits all alike
            outputs = {}
            for method, version in order:
                target.__class__ = base_class  # give the model the version's generate()
                package = old if version == "old" else hf_specdec
                package.speculative(target)
                kwargs = settings[method](package) if method in settings else {}
                began = time.perf_counter()
                out = target.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False, **kwargs)
                seconds[(method, version)] += time.perf_counter() - began
                outputs[(method, version)] = out
                new = out[:, inputs["input_ids"].shape[1] :]
                tokens[(method, version)] += int((new != tokenizer.pad_token_id).sum())
            for run in runs:
                identical[run] += int(torch.equal(outputs[run], outputs[("plain", "-")]))
        plain = tokens[("plain", "-")] / seconds[("plain", "-")]
        for run in runs:
            rate = tokens[run] / seconds[run]
            speedup = rate / plain
            print(f"{run[0]:8s} {run[1]:4s} {rate:6.2f} tokens/s  {speedup:5.3f}x plain  identical {identical[run]}")


if __name__ == "__main__":
    main()
