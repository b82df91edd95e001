#!/usr/bin/env bash
# One prepared check of the GPU paths, for a machine with one CUDA GPU (`--budget`, default 540 s: a
# path not started by then is skipped and the rows still print; each path `--limit` 150 s): bf16 sft (full,
# LoRA), DPO, GRPO and PPO with the built-in engine, DeepSpeed ZeRO-2/3 and FSDP2 on one rank, QLoRA
# 4-bit, --use_liger_kernel, chunked log-probs at Qwen2.5-0.5B's shape against full logits, and the
# GRPO and DPO steps against TRL, SFT/LoRA/DPO/GRPO at Qwen2.5-0.5B's shape against TRL
# (benchmarks/real_shape.py), RePULSe (`--rlhf_type harmless`, the proposal a copy and a LoRA adapter)
# and examples/red_team.sh (attacks and estimates). One line per path (PASS/FAIL/SKIP, seconds, peak GPU memory), then
# rows for README's "Verified on" table. Without a CUDA GPU it says so in one line and exits 2.
#
#   bash scripts/gpu_check.sh [--only PATH ...] [--out DIR] [--limit SECONDS]
#
# On a machine without a package registry, first run `bash scripts/gpu_wheels.sh` where there is one
# and carry .gpu_wheels/ along: they are installed into $GPU_SITE (default /tmp/swift-gpu-site).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi > /dev/null 2>&1 || ! nvidia-smi -L > /dev/null 2>&1; then
    echo "gpu_check: no CUDA GPU here (nvidia-smi finds none): nothing was run"
    exit 2
fi
PY=${PYTHON:-python3}
PATHS_ADDED=$PWD
if compgen -G ".gpu_wheels/*" > /dev/null; then
    SITE=${GPU_SITE:-/tmp/swift-gpu-site}
    if compgen -G ".gpu_wheels/*.whl" > /dev/null; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" .gpu_wheels/*.whl
    fi
    if compgen -G ".gpu_wheels/*.tar.gz" > /dev/null; then  # DeepSpeed: no wheel on PyPI, built here
        DS_BUILD_OPS=0 "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --upgrade \
            --target "$SITE" .gpu_wheels/*.tar.gz || echo "gpu_check: DeepSpeed did not build: zero2/zero3 will SKIP"
    fi
    PATHS_ADDED="$SITE:$PWD"
fi
export PYTHONPATH="$PATHS_ADDED${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" scripts/gpu_check.py "$@"
