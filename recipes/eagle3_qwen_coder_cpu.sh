#!/usr/bin/env bash
# EAGLE-3 heads for Qwen2.5-Coder-1.5B-Instruct on a CPU, from scratch, in one go: the data of eagle_qwen_coder_cpu.sh
# (1,000 ShareGPT V3 requests: maths, code, chat), replies self-distilled by the base with the states EAGLE-3 reads
# kept from the generation (the inputs of layers 2, 14 and 25, and the last), EAGLE-3's one layer trained unrolled to
# 4 depths on the base's distributions over a 16k draft vocabulary, lr 6e-4, its MLP narrowed to 2,240 as the EAGLE
# recipe's. vLLM serves the heads after `hf-specdec export OUT --to vllm` (docs/serving.md). From scratch on a 2-core
# CPU: 67 min 34 s (self-distillation 36 min 16 s, 3 epochs of training 30 min 30 s; docs/training.md).
# Rerun with the same OUTPUT_DIR to resume: the data files and self-distilled shards are reused.
#   bash recipes/eagle3_qwen_coder_cpu.sh [OUTPUT_DIR]
# Cost and result on a 2-core CPU (docs/training.md, Recipes): 67 min 34 s; held-out top-1 0.427 / 0.380 / 0.349 /
# 0.321; decodes at tau 1.63 (1.54x plain) with tree=8, 2.31 (1.93x) with tree=16 and prompt lookup.
# DRY_RUN=1 prints the plan instead of training: the data counted, each stage timed on one batch here (the
# prompts are exported all the same, for the run to reuse).
set -euo pipefail
out=${1:-heads/qwen15-eagle3}
data=$out/data
mkdir -p "$data"
pick=(--min-prompt-chars 20 --max-prompt-chars 400 --min-ascii 0.97)
[ -s "$data/maths.jsonl" ] || hf-specdec data --topic maths --n 195 "${pick[@]}" --out "$data/maths.jsonl"
[ -s "$data/code.jsonl" ] || hf-specdec data --topic code --n 604 "${pick[@]}" --out "$data/code.jsonl"
[ -s "$data/chat.jsonl" ] || hf-specdec data --topic other --n 201 "${pick[@]}" --out "$data/chat.jsonl"
python "$(dirname "$0")/train_medusa.py" ${DRY_RUN:+--dry_run} --base qwen2.5-coder-1.5b --dtype bfloat16 \
    --data "$data/maths.jsonl,$data/code.jsonl,$data/chat.jsonl" --self_distill --distill_max_new_tokens 128 \
    --distill_batch_size 64 --cache_hidden_states --soft_targets --head_type eagle3 --num_heads 4 \
    --head_intermediate_size 2240 --head_vocab_size 16384 --max_length 288 --output_dir "$out" \
    --num_train_epochs 3 --per_device_train_batch_size 8 --learning_rate 6e-4 --warmup_steps 10 \
    --lr_scheduler_type cosine --bf16 --use_cpu --save_strategy no --report_to none --eval_fraction 0.05 \
    --logging_steps 20
if [ -n "${DRY_RUN:-}" ]; then
    echo "Dry run: nothing trained; the exported prompts stay in $data for the run to reuse."
else
    echo "Heads in $out."
fi
