#!/usr/bin/env bash
# Pre-train, then fine-tune, the built-in tiny model on built-in two-digit addition, all on CPU.
# The last line printed is the exact-match accuracy of greedy answers on the held-out eval split.
# SEED picks the data order (the built-in model's initial weights are fixed).
set -euo pipefail
OUT=${OUT:-output/quickstart}
SEED=${SEED:-42}
if [ -e "$OUT/pt" ] || [ -e "$OUT/sft" ]; then  # each stage writes into a fixed directory, which must be new
    if [ "${OVERWRITE:-0}" != 1 ]; then
        echo "quickstart.sh: $OUT holds an earlier run: set OUT to a new directory, or OVERWRITE=1 to replace it" >&2
        exit 1
    fi
    rm -rf "$OUT/pt" "$OUT/sft"
fi
# AdamW with beta2 0.98 and weight decay 0.1 (both stages): the second-moment estimate follows the
# sharp drop in loss when the model starts to add, instead of lagging behind it as with 0.999.
# Gradient checkpointing (on by default, as in ms-swift) is off: a 1M-parameter model needs no
# memory saved, and recomputing activations only costs time (it does not change the results).

# 1. pt: every token of "07+45=52" gets loss; teaches the digits and the format. A gentle learning
#    rate: a hot pt stage settles into a state that sft then takes far longer to leave.
swift pt \
    --model builtin:tiny-chat \
    --dataset builtin:arith-pt \
    --num_train_epochs 1 \
    --per_device_train_batch_size 64 \
    --learning_rate 1e-3 \
    --adam_beta2 0.98 \
    --weight_decay 0.1 \
    --warmup_ratio 0.05 \
    --seed "$SEED" \
    --data_seed "$SEED" \
    --save_strategy no \
    --add_version false \
    --gradient_checkpointing false \
    --output_dir "$OUT/pt"

# 2. sft: chat format, loss on the answer only; generation-based eval on the held-out split (sums
#    whose operands, in either order, never appear in training).
swift sft \
    --model "$OUT/pt" \
    --gradient_checkpointing false \
    --tuner_type full \
    --dataset builtin:arith-sft \
    --val_dataset builtin:arith-sft:eval \
    --max_steps 2000 \
    --per_device_train_batch_size 64 \
    --learning_rate 3e-3 \
    --adam_beta2 0.98 \
    --weight_decay 0.1 \
    --warmup_ratio 0.05 \
    --eval_steps 2000 \
    --predict_with_generate true \
    --generation_max_length 8 \
    --seed "$SEED" \
    --data_seed "$SEED" \
    --save_strategy no \
    --add_version false \
    --output_dir "$OUT/sft"

python -c "import json,sys; m=json.load(open(sys.argv[1]))['metrics']; print(f\"eval accuracy: {m['eval_acc']:.3f}\")" "$OUT/sft/result.json"
