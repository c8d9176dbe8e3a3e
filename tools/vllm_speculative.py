"""Serve drafts exported with `hf-specdec export --to vllm` with vLLM's offline `LLM`: greedy decoding without
and with each draft, on the same token prompts, and vLLM's own speculative-decoding counters. Runs in vLLM's
environment (tools/make_vllm_venv.sh), not this library's: it imports only vLLM.

    .venv-vllm/bin/python tools/vllm_speculative.py --base BASE_DIR --method medusa --draft HEADS_DIR \
        --prompts prompts.json --num-speculative-tokens 3 --max-tokens 64 --out result.json

`--method` is vLLM's speculative method (`medusa`, `eagle3`, `eagle`); `--draft` may be given several times
(each draft is served by an engine of its own, after the plain one). `prompts.json` holds a list of token-id
lists. `result.json` gets `plain` (the generated token ids per prompt), `drafts` (per draft folder, as given:
`tokens`, the generated token ids per prompt, and `metrics`: `num_drafts`, `num_draft_tokens`,
`num_accepted_tokens`, `accepted_per_position`) and `seconds` (each engine's start and generation, wall time).
The engine starts in a process of its own (spawn), hence the `__main__` guard.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from pathlib import Path
from typing import Any


def generate(
    base: str, prompts: list[list[int]], max_tokens: int, dtype: str, speculative: dict[str, Any] | None
) -> tuple[list[list[int]], dict[str, Any]]:
    """Greedy token ids per prompt, and the speculative-decoding counters (empty without `speculative`) with the
    engine's start and generation times."""
    from vllm import LLM, SamplingParams

    start = time.perf_counter()
    llm = LLM(
        model=base,
        dtype=dtype,
        max_model_len=1024,
        enforce_eager=True,
        seed=0,
        disable_log_stats=False,
        speculative_config=speculative,
    )
    started = time.perf_counter()
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params, use_tqdm=False)
    tokens = [list(output.outputs[0].token_ids) for output in outputs]
    metrics: dict[str, Any] = _spec_metrics(llm.get_metrics()) if speculative else {}
    metrics["seconds"] = {"start": round(started - start, 1), "generate": round(time.perf_counter() - started, 1)}
    del llm
    gc.collect()
    return tokens, metrics


def _spec_metrics(metrics: list[Any]) -> dict[str, Any]:
    names = {
        "vllm:spec_decode_num_drafts": "num_drafts",
        "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
        "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
        "vllm:spec_decode_num_accepted_tokens_per_pos": "accepted_per_position",
    }
    found: dict[str, Any] = {}
    for metric in metrics:
        if metric.name in names:
            found[names[metric.name]] = list(metric.values) if hasattr(metric, "values") else metric.value
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the base model's folder")
    parser.add_argument("--method", default="medusa", help="vLLM's speculative method: medusa, eagle3 or eagle")
    parser.add_argument(
        "--draft", action="append", required=True, help="a draft exported with `hf-specdec export --to vllm`"
    )
    parser.add_argument("--prompts", type=Path, required=True, help="JSON list of token-id lists")
    parser.add_argument("--num-speculative-tokens", type=int, required=True)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB
    prompts = json.loads(args.prompts.read_text())
    plain, plain_metrics = generate(args.base, prompts, args.max_tokens, args.dtype, None)
    seconds = {"plain": plain_metrics.pop("seconds")}
    drafts = {}
    for folder in args.draft:
        speculative = {"method": args.method, "model": folder, "num_speculative_tokens": args.num_speculative_tokens}
        tokens, metrics = generate(args.base, prompts, args.max_tokens, args.dtype, speculative)
        seconds[folder] = metrics.pop("seconds")
        drafts[folder] = {"tokens": tokens, "metrics": metrics}
    args.out.write_text(json.dumps({"plain": plain, "drafts": drafts, "seconds": seconds}))


if __name__ == "__main__":
    main()
