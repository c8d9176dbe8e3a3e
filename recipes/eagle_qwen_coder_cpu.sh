#!/usr/bin/env bash
# EAGLE heads for Qwen2.5-Coder-1.5B-Instruct on a CPU, from scratch, in one go: the data of qwen_coder_cpu.sh
# (1,000 ShareGPT V3 requests, two thirds of its 1,490, in its proportions: maths, code, chat), replies self-distilled
# by the base with their hidden states kept from the generation, one decoder layer trained unrolled to 4 depths over a
# 16k draft vocabulary, with soft targets, lr 6e-4 and no feature loss (the best of the short comparisons in
# docs/training.md). Its MLP is narrowed to 2,240: a training step then takes about a third of the full width's (timed
# on a random batch). From scratch on a 2-core CPU: 44 min 19 s (self-distillation 21 min 34 s, 3 epochs of training
# 22 min 4 s; docs/training.md).
# Rerun with the same OUTPUT_DIR to resume: the data files and self-distilled shards are reused.
#   bash recipes/eagle_qwen_coder_cpu.sh [OUTPUT_DIR]
# Cost and result on a 2-core CPU (docs/training.md, Recipes): 44 min 19 s; held-out top-1 0.401 / 0.375 / 0.365 /
# 0.355; decodes at tau 1.67 (1.55x plain) with tree=8, 2.38 (1.98x) with tree=16 and prompt lookup.
# DRY_RUN=1 prints the plan instead of training: the data counted, each stage timed on one batch here (the
# prompts are exported all the same, for the run to reuse).
set -euo pipefail
out=${1:-heads/qwen15-eagle}
data=$out/data
mkdir -p "$data"
pick=(--min-prompt-chars 20 --max-prompt-chars 400 --min-ascii 0.97)
[ -s "$data/maths.jsonl" ] || hf-specdec data --topic maths --n 195 "${pick[@]}" --out "$data/maths.jsonl"
[ -s "$data/code.jsonl" ] || hf-specdec data --topic code --n 604 "${pick[@]}" --out "$data/code.jsonl"
[ -s "$data/chat.jsonl" ] || hf-specdec data --topic other --n 201 "${pick[@]}" --out "$data/chat.jsonl"
python "$(dirname "$0")/train_medusa.py" ${DRY_RUN:+--dry_run} --base qwen2.5-coder-1.5b --dtype bfloat16 \
    --data "$data/maths.jsonl,$data/code.jsonl,$data/chat.jsonl" --self_distill --distill_max_new_tokens 128 \
    --distill_batch_size 64 --cache_hidden_states --soft_targets --head_type eagle --num_heads 4 \
    --head_intermediate_size 2240 --head_vocab_size 16384 --max_length 288 --output_dir "$out" --feature_weight 0 \
    --num_train_epochs 3 --per_device_train_batch_size 8 --learning_rate 6e-4 --warmup_steps 10 \
    --lr_scheduler_type cosine --bf16 --use_cpu --save_strategy no --report_to none --eval_fraction 0.05 \
    --logging_steps 20
if [ -n "${DRY_RUN:-}" ]; then
    echo "Dry run: nothing trained; the exported prompts stay in $data for the run to reuse."
else
    echo "Heads in $out."
fi
