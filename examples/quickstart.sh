#!/usr/bin/env bash
# Pre-train, then fine-tune, the built-in tiny model on built-in two-digit addition, all on CPU.
# The last line printed is the exact-match accuracy on the held-out eval split.
set -euo pipefail
OUT=${OUT:-output/quickstart}

# 1. pt: every token of "07+45=52" gets loss; teaches the format and the digits.
swift pt \
    --model builtin:tiny-chat \
    --dataset builtin:arith-pt \
    --num_train_epochs 1 \
    --per_device_train_batch_size 128 \
    --learning_rate 3e-3 \
    --warmup_ratio 0.05 \
    --save_strategy no \
    --output_dir "$OUT/pt"

# 2. sft: chat format, loss on the answer only; generation-based eval on the held-out split.
swift sft \
    --model "$OUT/pt" \
    --tuner_type full \
    --dataset builtin:arith-sft \
    --val_dataset builtin:arith-sft:eval \
    --max_steps 700 \
    --per_device_train_batch_size 128 \
    --learning_rate 3e-3 \
    --warmup_ratio 0.05 \
    --eval_steps 350 \
    --predict_with_generate true \
    --generation_max_length 8 \
    --save_strategy no \
    --output_dir "$OUT/sft"

python -c "import json,sys; m=json.load(open(sys.argv[1]))['metrics']; print(f\"eval accuracy: {m['eval_acc']:.3f}\")" "$OUT/sft/result.json"
