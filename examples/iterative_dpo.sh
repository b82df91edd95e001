#!/usr/bin/env bash
# Iterative DPO on the built-in arithmetic task, all on CPU: a model that is often wrong about carries
# learns from its own answers, checked by the accuracy reward. Three rounds of
#   swift sample  8 answers per prompt at temperature 1 for $PROMPTS training prompts (a new draw of
#                 prompts and sampling seeds each round), scored by the accuracy reward against the `solution` column;
#                 sample_pairs.jsonl pairs a right answer (chosen) with a wrong one (rejected)
#   swift rlhf    --rlhf_type dpo on those pairs (with RPO's NLL term on the chosen answer), one
#                 epoch from the previous round's model, which is also its reference
# with the held-out accuracy (swift eval on the 576 eval sums, greedy answers) after each round.
#
# The start: the quickstart's model ($QUICKSTART/sft; the quickstart runs first if it is missing)
# already answers ~100% of the held-out sums, so there is nothing left for DPO to raise. It is first
# fine-tuned for $CONFUSE_STEPS steps on training sums whose tens digit is wrong about the carry out
# of the units: dropped in $DROP_RATE of the sums that have one ("27+45=62"), added in
# $SPURIOUS_RATE of those that have none ("21+45=76") — a model that has learned a wrong habit
# (greedy, it drops every carry). No labelled answer is used after that: every round learns from the
# model's own samples.
# The last lines printed are "round R: held-out accuracy X" for R = 0 (the start) .. $ROUNDS.
set -euo pipefail
OUT=${OUT:-output/iterative_dpo}
QUICKSTART=${QUICKSTART:-output/quickstart}
SEED=${SEED:-42}
DROP_RATE=${DROP_RATE:-0.7}
SPURIOUS_RATE=${SPURIOUS_RATE:-0.3}
CONFUSE_STEPS=${CONFUSE_STEPS:-300}
PROMPTS=${PROMPTS:-1024}
ROUNDS=${ROUNDS:-3}
DPO_LR=${DPO_LR:-5e-4}
DPO_BETA=${DPO_BETA:-0.5}
DPO_EPOCHS=${DPO_EPOCHS:-1}
HERE=$(cd "$(dirname "$0")" && pwd)

if [ ! -f "$QUICKSTART/sft/config.json" ]; then
    OUT="$QUICKSTART" SEED="$SEED" bash "$HERE/quickstart.sh"
fi
if [ -n "$(ls -A "$OUT" 2>/dev/null)" ] && [ "${OVERWRITE:-0}" != 1 ]; then
    echo "iterative_dpo.sh: $OUT is not empty (an earlier run?): set OUT to a new directory, or OVERWRITE=1" >&2
    exit 1
fi
# OVERWRITE=1: what this script writes goes (its training stages write into fixed directories,
# which must be new); anything else in $OUT (the quickstart's model, say) stays
rm -rf "$OUT"/round[0-9]* "$OUT"/eval "$OUT"/eval_round*.log "$OUT"/confused.jsonl
mkdir -p "$OUT"

accuracy() {  # model directory, round → prints "round R: held-out accuracy X"
    swift eval --model "$1" --eval_dataset arith --eval_generation_config '{"max_tokens": 6}' \
        --eval_output_dir "$OUT/eval/round$2" > "$OUT/eval_round$2.log" 2>&1
    python - "$OUT/eval/round$2" "$2" <<'PY'
import glob, json, sys
report = json.load(open(sorted(glob.glob(sys.argv[1] + "/*/report.json"))[-1]))
print(f"round {sys.argv[2]}: held-out accuracy {report['results']['arith']['acc']:.3f}")
PY
}

# 0. the start: the quickstart's model, taught to be wrong about carries
python - "$OUT/confused.jsonl" "$SEED" "$DROP_RATE" "$SPURIOUS_RATE" <<'PY'
import json, random, sys

from swift.dataset.arith import arith_sft

rng, drop, spurious = random.Random(int(sys.argv[2])), float(sys.argv[3]), float(sys.argv[4])
with open(sys.argv[1], "w") as f:
    for row in arith_sft("train"):
        a, b = (int(x) for x in row["messages"][0]["content"].rstrip("=").split("+"))
        answer = a + b
        if a % 10 + b % 10 >= 10:
            answer -= 10 if rng.random() < drop else 0  # the tens digit misses the carry
        else:
            answer += 10 if rng.random() < spurious else 0  # or gets one that is not there
        f.write(json.dumps({"messages": [row["messages"][0], {"role": "assistant", "content": str(answer)}]}) + "\n")
PY
swift sft \
    --model "$QUICKSTART/sft" \
    --tuner_type full \
    --dataset "$OUT/confused.jsonl" \
    --max_steps "$CONFUSE_STEPS" \
    --per_device_train_batch_size 64 \
    --learning_rate 1e-3 \
    --adam_beta2 0.98 \
    --warmup_ratio 0.05 \
    --seed "$SEED" \
    --data_seed "$SEED" \
    --gradient_checkpointing false \
    --save_strategy no \
    --add_version false \
    --output_dir "$OUT/round0" > "$OUT/round0.log" 2>&1
model="$OUT/round0"
accuracy "$model" 0

for round in $(seq 1 "$ROUNDS"); do
    # 1. sample and score; sample_pairs.jsonl holds one chosen/rejected pair per prompt that has both
    swift sample \
        --model "$model" \
        --dataset "builtin:arith-sft#$PROMPTS" \
        --seed "$((SEED + round))" \
        --num_return_sequences 8 \
        --n_best_to_keep 1 \
        --temperature 1.0 \
        --max_new_tokens 6 \
        --num_sampling_batch_size 64 \
        --max_batch_size 512 \
        --orm_model accuracy \
        --output_dir "$OUT/round$round/sample" \
        --override_exist_file true > "$OUT/round$round.sample.log" 2>&1
    # 2. DPO (+ RPO) on the pairs, from the previous round's model (also its reference)
    swift rlhf \
        --rlhf_type dpo \
        --model "$model" \
        --tuner_type full \
        --dataset "$OUT/round$round/sample/sample_pairs.jsonl" \
        --beta "$DPO_BETA" \
        --rpo_alpha 1.0 \
        --learning_rate "$DPO_LR" \
        --warmup_ratio 0.1 \
        --adam_beta2 0.98 \
        --num_train_epochs "$DPO_EPOCHS" \
        --per_device_train_batch_size 32 \
        --seed "$SEED" \
        --data_seed "$SEED" \
        --gradient_checkpointing false \
        --save_strategy no \
        --add_version false \
        --output_dir "$OUT/round$round/dpo" > "$OUT/round$round.dpo.log" 2>&1
    model="$OUT/round$round/dpo"
    echo "round $round: $(wc -l < "$OUT/round$round/sample/sample_pairs.jsonl") pairs"
    accuracy "$model" "$round"
done
