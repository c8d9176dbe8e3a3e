#!/usr/bin/env bash
# Regenerate the results of docs/benchmarks.md (its tables, "Measured on" lines and plots) from one fresh run of
# the benchmark on this machine: batch 1, then batch 4, then the page's blocks rewritten from the two runs.
#
#   bash tools/benchmarks_page.sh [HEADS] [OUT]
#
# HEADS: EAGLE-3 heads for Qwen2.5-Coder-1.5B-Instruct (default heads/qwen15-eagle3, which
# `bash recipes/eagle3_qwen_coder_cpu.sh heads/qwen15-eagle3` makes); OUT: where the runs go (default
# bench_results). Run it with nothing else running: it times generations (about 45 minutes on 2 CPU cores).
set -euo pipefail
cd "$(dirname "$0")/.."
heads=${1:-heads/qwen15-eagle3}
out=${2:-bench_results}
# FLOAT32=1: the page's float32 batches instead (8, 4 and 1, packed, no heads), for a CPU without bf16 instructions.
if [[ -n "${FLOAT32:-}" ]]; then
    fp32=(--target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --prompts mt-bench,humaneval,gsm8k
        --max-new-tokens 64 --dtype auto --pack-linears)
    methods=plain,specdec,specdec-tree16,lookup,specdec-lookup
    hf-specdec bench "${fp32[@]}" --n 8 --batch-size 8 --methods "$methods" --out "$out/sweep_b8"
    hf-specdec bench "${fp32[@]}" --n 12 --batch-size 4 --methods "$methods" --out "$out/sweep_b4"
    hf-specdec bench "${fp32[@]}" --n 6 --batch-size 1 --methods plain,specdec,lookup,specdec-lookup --out "$out/sweep_b1"
    python -m hf_specdec.bench.sweep docs/benchmarks.md fp32-sweep "$out"/sweep_b{1,4,8}
    exit 0
fi
# SWEEP=1: the page's bf16 batch sweep (batch 1, 4, 8 and 16, one table and a plot), for a CPU with AVX512-BF16.
if [[ -n "${SWEEP:-}" ]]; then
    sweep=(--target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --prompts mt-bench,humaneval,gsm8k
        --max-new-tokens 64 --dtype bfloat16 --seed 13
        --methods plain,specdec,specdec-tree16,lookup,specdec-lookup,specdec-int8-lookup)
    hf-specdec bench "${sweep[@]}" --n 6 --batch-size 1 --out "$out/bf16_b1"
    hf-specdec bench "${sweep[@]}" --n 12 --batch-size 4 --out "$out/bf16_b4"
    hf-specdec bench "${sweep[@]}" --n 16 --batch-size 8 --out "$out/bf16_b8"
    hf-specdec bench "${sweep[@]}" --n 16 --batch-size 16 --out "$out/bf16_b16"
    python -m hf_specdec.bench.sweep docs/benchmarks.md bf16-sweep "$out"/bf16_b{1,4,8,16}
    exit 0
fi
if [[ ! -d "$heads" ]]; then
    echo "No heads in $heads: make them with bash recipes/eagle3_qwen_coder_cpu.sh $heads" >&2
    exit 2
fi
common=(--target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --medusa "$heads"
    --prompts mt-bench,humaneval,gsm8k --n 12 --max-new-tokens 96 --dtype bfloat16)
methods=specdec,specdec-tree16,lookup,specdec-lookup,specdec-int8-lookup,medusa-8,medusa-16-lookup
# --cost-curve: the verification cost curve docs/simulator.md calibrates against, timed in the same run.
hf-specdec bench "${common[@]}" --batch-size 1 --methods "plain,hf-assistant,$methods" --cost-curve --out "$out/qwen_b1"
# transformers' assisted generation takes batch size 1 only.
hf-specdec bench "${common[@]}" --batch-size 4 --methods "plain,$methods" --out "$out/qwen_b4"
python -m hf_specdec.bench.page docs/benchmarks.md README.md batch1="$out/qwen_b1" batch4="$out/qwen_b4"
echo "docs/benchmarks.md and README.md rewritten from $out/qwen_b1 and $out/qwen_b4."
