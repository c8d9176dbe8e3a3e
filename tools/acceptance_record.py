"""Record what speculative steps achieve on the real Qwen2.5-Coder pair and the benchmark's prompts, for
`hf-specdec gpu`'s predictions (src/hf_specdec/bench/acceptance_record.json).

    python tools/acceptance_record.py                       # 6 prompts, 128 new tokens, bf16, this CPU
    python tools/acceptance_record.py --n 12 --out record.json
    python tools/acceptance_record.py --heads heads/qwen15-eagle3   # the heads' methods, added to the record

With `--heads` (EAGLE-3 heads for the target, e.g. from recipes/eagle3_qwen_coder_cpu.sh), only the heads' methods
run, and they join the record's other methods (the setting says which heads).

Greedy; every method drafts at fixed settings with free costs, so the counts depend on the models and prompts
only, not on how fast or busy the machine is.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path
from typing import Any

import torch
import transformers
from tqdm import tqdm

import hf_specdec
from hf_specdec import SpeculativeCosts
from hf_specdec.bench.acceptance_record import RECORD_FILE, StepRecord
from hf_specdec.bench.prompts import chat_inputs, load_prompts
from hf_specdec.zoo import load_model

FREE = SpeculativeCosts(0.0, 0.0)
METHODS: dict[str, dict[str, Any]] = {
    "draft-chain-8": {"assistant": "draft", "num_assistant_tokens": 8, "num_assistant_tokens_schedule": "constant"},
    "draft-tree-16": {"assistant": "draft", "tree": 16},
    "lookup-10": {"prompt_lookup_num_tokens": 10},
    "draft-lookup-10": {"assistant": "draft", "prompt_lookup_num_tokens": 10},
}
HEADS_METHODS: dict[str, dict[str, Any]] = {
    "heads-tree-8": {"medusa": True, "tree": 8},
    "heads-lookup-16": {"medusa": True, "tree": 16, "prompt_lookup_num_tokens": 10},
}
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "src" / "hf_specdec" / "bench" / RECORD_FILE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b")
    parser.add_argument("--prompts", default="mt-bench,humaneval,gsm8k")
    parser.add_argument("--n", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--heads", help="EAGLE-3 heads for the target: record their methods and add them")
    args = parser.parse_args()
    if args.heads and not args.out.is_file():
        parser.error(f"--heads adds the heads' methods to a record: {args.out} is not there (run without --heads)")

    target, tokenizer = load_model(args.target, torch.bfloat16)
    target = hf_specdec.speculative(target)
    if args.heads:
        from hf_specdec import MedusaForCausalLM

        model, draft, methods = MedusaForCausalLM.from_pretrained(args.heads, base_model=target), None, HEADS_METHODS
    else:
        model, draft, methods = target, load_model(args.draft, torch.bfloat16)[0], METHODS
    prompts = load_prompts(args.prompts.split(","), args.n)
    records: dict[str, StepRecord] = {}
    for prompt in tqdm(prompts, desc="prompts"):
        inputs = chat_inputs(tokenizer, [prompt.text])
        for name, kwargs in methods.items():
            call = {k: (draft if v == "draft" else v) for k, v in kwargs.items()}
            out = model.generate(
                **inputs,
                max_new_tokens=args.max_new_tokens,
                do_sample=False,
                return_dict_in_generate=True,
                speculative_costs=FREE,
                **call,
            )
            described = ", ".join(f"{k}={v}" for k, v in kwargs.items())
            record = StepRecord.from_stats(name, described, out.speculative)
            records[name] = records[name].merged(record) if name in records else record
    setting = {
        "target": args.target,
        "draft": args.draft,
        "dtype": "bfloat16",
        "decoding": "greedy, batch 1",
        "prompts": f"{args.n} from {args.prompts} (seed 0), chat template",
        "max_new_tokens": args.max_new_tokens,
        "recorded": datetime.date.today().isoformat(),
        "versions": f"hf_specdec {hf_specdec.__version__}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}",
        "command": "python tools/acceptance_record.py",
    }
    if args.heads:  # the heads' methods join the record's others, from the setting they were recorded in
        data = json.loads(args.out.read_text())
        data["setting"]["heads"] = {
            "heads": args.heads,
            "prompts": setting["prompts"],
            "recorded": setting["recorded"],
            "command": f"python tools/acceptance_record.py --heads {args.heads}",
        }
        kept = [m for m in data["methods"] if m["method"] not in records]
        data["methods"] = kept + [r.to_json() for r in records.values()]
    else:
        data = {"setting": setting, "methods": [r.to_json() for r in records.values()]}
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    for record in records.values():
        print(f"{record.method}: tau {record.tau:.2f}, {record.steps} steps, {record.draft_forwards} draft forwards")


if __name__ == "__main__":
    main()
