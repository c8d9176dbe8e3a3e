#!/usr/bin/env bash
# How EAGLE-3 heads for Qwen2.5-Coder-1.5B-Instruct improve with data: one pass over 1,200 ShareGPT V3 requests
# (maths, code and chat in eagle3_qwen_coder_cpu.sh's proportions) whose replies the base writes itself, with the
# states EAGLE-3 reads kept from that generation, at a constant learning rate, with a checkpoint every 15 steps
# (120 requests); checkpoints from 120 to 1,200 requests measured on 60 held-out requests the base answers itself
# and in decoding on the benchmark's prompts (tree=8). The heads are eagle3_qwen_coder_cpu.sh's.
# The figures, the plot and what they say are in docs/training.md ("How acceptance grows with data").
# Rerun with the same OUTPUT_DIR to resume: the data, self-distilled shards, checkpoints and points are kept.
#   bash recipes/eagle3_qwen_coder_curve_cpu.sh [OUTPUT_DIR]
# Cost and result on a 2-core CPU (docs/training.md, How acceptance grows with data): self-distillation about 65 min,
# 150 steps of 5.8 s, about 8 min to measure each point; at step 150 (0.21M tokens) held-out top-1 0.346 / 0.295 /
# 0.262 / 0.231, expected tau 1.87, decoding tau 1.50 with tree=8.
# DRY_RUN=1 prints the plan instead of training: the data counted, each stage timed on one batch here (the
# prompts are exported all the same, for the run to reuse).
set -euo pipefail
out=${1:-heads/qwen15-eagle3-curve}
data=$out/data
mkdir -p "$data"
pick=(--min-prompt-chars 20 --max-prompt-chars 400 --min-ascii 0.97)
if [ ! -s "$data/held_out.jsonl" ]; then
    # The first 234 / 725 / 241 of each topic train, the next 12 / 36 / 12 are held out.
    hf-specdec data --topic maths --n 246 "${pick[@]}" --out "$data/maths_all.jsonl"
    hf-specdec data --topic code --n 761 "${pick[@]}" --out "$data/code_all.jsonl"
    hf-specdec data --topic other --n 253 "${pick[@]}" --out "$data/chat_all.jsonl"
    head -n 234 "$data/maths_all.jsonl" > "$data/maths.jsonl"
    head -n 725 "$data/code_all.jsonl" > "$data/code.jsonl"
    head -n 241 "$data/chat_all.jsonl" > "$data/chat.jsonl"
    tail -n +235 "$data/maths_all.jsonl" > "$data/held_out.jsonl"  # what follows the training lines only
    tail -n +726 "$data/code_all.jsonl" >> "$data/held_out.jsonl"
    tail -n +242 "$data/chat_all.jsonl" >> "$data/held_out.jsonl"
fi
resume=()
if compgen -G "$out/checkpoint-*" > /dev/null; then
    resume=(--resume_from_checkpoint true)  # an interrupted run goes on from its last checkpoint
fi
if [ ! -d "$out/checkpoint-150" ]; then
    python "$(dirname "$0")/train_medusa.py" ${DRY_RUN:+--dry_run} --base qwen2.5-coder-1.5b --dtype bfloat16 \
        --data "$data/maths.jsonl,$data/code.jsonl,$data/chat.jsonl" --self_distill --distill_max_new_tokens 128 \
        --distill_batch_size 64 --cache_hidden_states --soft_targets --head_type eagle3 --num_heads 4 \
        --head_intermediate_size 2240 --head_vocab_size 16384 --max_length 288 --output_dir "$out" \
        --num_train_epochs 1 --per_device_train_batch_size 8 --learning_rate 6e-4 --warmup_steps 10 \
        --lr_scheduler_type constant_with_warmup --bf16 --use_cpu --eval_fraction 0 --save_strategy steps \
        --save_steps 15 --report_to none --logging_steps 15 "${resume[@]}"
fi
[ -z "${DRY_RUN:-}" ] || exit 0
python "$(dirname "$0")/../tools/scaling_curve.py" --base qwen2.5-coder-1.5b --run "$out" --steps 15,30,60,90,150 \
    --eval-data "$data/held_out.jsonl" --eval-self-distill --max-length 288 --trees 8 --out "$out/curve.json" \
    --plot "$out/curve.png"
echo "Points in $out/curve.json, plot in $out/curve.png."
