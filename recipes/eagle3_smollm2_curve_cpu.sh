#!/usr/bin/env bash
# How EAGLE-3 heads for SmolLM2-135M-Instruct improve with data: one pass over 6,800 first exchanges of ShareGPT V3
# (about 2.3M tokens of replies GPT wrote, teacher-forced: the heads learn the base's distributions over them,
# --soft_targets), at a constant learning rate, with a checkpoint every 25 steps; each checkpoint measured on 100
# held-out requests the base answers itself (--eval_self_distill) and in decoding on the benchmark's prompts.
# The pass runs in two stages, as the measured run did: the first 5,300 exchanges (662 steps, batches grouped by
# length), then the next 1,500 in order (to step 850, resumed from the first stage's last checkpoint).
# The figures, the plot and what they say are in docs/training.md ("How acceptance grows with data").
# Rerun with the same OUTPUT_DIR to resume: the data, the held-out replies, finished stages and points are kept.
#   bash recipes/eagle3_smollm2_curve_cpu.sh [OUTPUT_DIR]
# Cost and result on a 2-core CPU (docs/training.md, How acceptance grows with data): 850 steps of 2 to 6.6 s on a
# quiet machine (the measured run shared it), 2.26M tokens; the last checkpoint's held-out top-1 0.391 / 0.327 /
# 0.309 / 0.286, expected tau 2.05, decoding tau 1.52 with tree=16.
# DRY_RUN=1 prints the plan instead of training: the data counted, each stage timed on one batch here (the
# prompts are exported all the same, for the run to reuse).
set -euo pipefail
out=${1:-heads/smollm2-eagle3-curve}
data=$out/data
mkdir -p "$data"
if [ ! -s "$data/train_more.jsonl" ]; then
    hf-specdec data --n 20000 --min-prompt-chars 20 --max-prompt-chars 1000 --min-ascii 0.97 --out "$data/all.jsonl"
    head -n 5300 "$data/all.jsonl" > "$data/train.jsonl"
    head -n 6800 "$data/all.jsonl" > "$data/train_more.jsonl"  # the first 5,300 and the next 1,500
    tail -n 300 "$data/all.jsonl" | head -n 100 > "$data/held_out.jsonl"  # never trained on
fi
common=(--base smollm2-135m --dtype bfloat16 --eval_data "$data/held_out.jsonl" --eval_self_distill \
    --distill_max_new_tokens 128 --distill_batch_size 50 --head_type eagle3 --num_heads 4 --soft_targets \
    --head_vocab_size 8192 --max_length 512 --output_dir "$out" --per_device_train_batch_size 8 --learning_rate 6e-4 \
    --warmup_steps 20 --lr_scheduler_type constant_with_warmup --bf16 --use_cpu --save_strategy steps --save_steps 25 \
    --report_to none --logging_steps 25)
if [ ! -d "$out/checkpoint-662" ]; then
    python "$(dirname "$0")/train_medusa.py" ${DRY_RUN:+--dry_run} "${common[@]}" --data "$data/train.jsonl" \
        --max_steps 662 --train_sampling_strategy group_by_length
fi
[ -z "${DRY_RUN:-}" ] || exit 0
if [ ! -d "$out/checkpoint-850" ]; then
    python "$(dirname "$0")/train_medusa.py" "${common[@]}" --data "$data/train_more.jsonl" --max_steps 850 \
        --train_sampling_strategy sequential --resume_from_checkpoint "$out/checkpoint-662"
fi
python "$(dirname "$0")/../tools/scaling_curve.py" --base smollm2-135m --run "$out" \
    --steps 75,150,225,300,450,662,850 --eval-data "$out/eval_self_distill.jsonl" \
    --train-data "$data/train_more.jsonl" --out "$out/curve.json" --plot "$out/curve.png"
echo "Points in $out/curve.json, plot in $out/curve.png."
