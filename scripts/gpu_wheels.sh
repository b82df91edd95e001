#!/usr/bin/env bash
# Download what scripts/gpu_check.sh needs on a GPU machine that reaches no package registry and
# already holds PyTorch, transformers, peft and accelerate (at other versions than ours): Python 3.12
# manylinux x86_64 wheels (and DeepSpeed's source archive, which PyPI ships without a wheel, built
# there) into .gpu_wheels/ (git-ignored), carried with the call to that machine.
#
#   bash scripts/gpu_wheels.sh            download, then list what fits the carry budget
#                                         (with the project's environment active: DeepSpeed's source
#                                         archive needs its setuptools and wheel to read its metadata)
#   bash scripts/gpu_wheels.sh --resolve  only check that every pinned name resolves (no download)
#
# Packages are in priority order; the carry budget (64 MiB for the working tree and the wheels
# together) is filled in that order, and what does not fit is named with the paths it leaves
# unverified. Versions are the project's pins (pyproject.toml / requirements/), so a changed pin
# changes what is carried.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=.gpu_wheels
BUDGET_MIB=${BUDGET_MIB:-64}

# name==version  what it is for (the check's paths that need it). Not carried: huggingface-hub and
# tokenizers (the machine's 1.33 and 0.23.2 satisfy transformers 5.19 and datasets 5.2; our pin, hub
# 2.4, would also need httpx2, which the machine lacks).
WHEELS=(
    "transformers==5.19.0 all paths (the machine's own is older)"
    "peft==0.21.2 all paths"
    "datasets==5.2.0 all paths"
    "dill==0.4.1 datasets"
    "multiprocess==0.70.19 datasets"
    "math-verify==0.9.0 the accuracy reward (grpo, ppo)"
    "latex2sympy2-extended==1.11.0 math-verify"
    "antlr4-python3-runtime==4.13.2 math-verify"
    "trl==1.16.0 the TRL comparison"
    "liger-kernel==0.8.5 --use_liger_kernel"
    "hjson==3.1.0 deepspeed"
    "pydantic==2.14.4 deepspeed"
    "pydantic-core==2.50.5 deepspeed"
    "annotated-types==0.8.0 deepspeed"
    "typing-inspection==0.4.5 deepspeed"
    "bitsandbytes==0.50.2 QLoRA 4-bit"
    "nanogcg==0.3.0 swift attack --attack gcg (red_team)"
)
SDISTS=("deepspeed==0.19.8 DeepSpeed ZeRO-2/ZeRO-3 (built there with DS_BUILD_OPS=0)")

PLATFORMS=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
for n in $(seq 17 39); do PLATFORMS+=(--platform "manylinux_2_${n}_x86_64"); done
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
        "${PLATFORMS[@]}")

names() { for line in "$@"; do echo "${line%% *}"; done; }

if [ "${1:-}" = "--resolve" ]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    # the wheels: resolved for the GPU machine's Python and platform from the index metadata
    python -m pip install -q --dry-run --ignore-installed --no-deps "${TARGET[@]}" --target "$tmp/t" \
        --report "$tmp/report.json" $(names "${WHEELS[@]}") 2>&1 | grep -v "^WARNING: Location" || true
    [ -s "$tmp/report.json" ] || { echo "gpu_wheels: the wheel list does not resolve (see above)"; exit 1; }
    python - "$tmp/report.json" "${#WHEELS[@]}" <<'PY'
import json, sys
found = json.load(open(sys.argv[1]))["install"]
for item in found:
    print(f"resolved {item['metadata']['name']}=={item['metadata']['version']} {item['download_info']['url'].rsplit('/', 1)[-1]}")
assert len(found) == int(sys.argv[2]), f"{len(found)} of {sys.argv[2]} resolved"
PY
    # the source archives: the index lists the pinned version's archive
    for spec in $(names "${SDISTS[@]}"); do
        python -m pip download -q --no-deps --no-binary=:all: --no-build-isolation -d "$tmp/s" "$spec" \
            2>&1 | grep -v "^WARNING: Location" || true
        ls "$tmp/s" | grep -q "^${spec%%==*}-${spec##*==}.tar.gz$" || { echo "gpu_wheels: $spec has no source archive"; exit 1; }
        echo "resolved $spec (source archive)"
    done
    exit 0
fi

rm -rf "$OUT.tmp"
mkdir -p "$OUT.tmp"
for line in "${WHEELS[@]}"; do
    python -m pip download -q --no-deps "${TARGET[@]}" -d "$OUT.tmp" "${line%% *}" 2>&1 | grep -v "^WARNING: Location" || true
done
for line in "${SDISTS[@]}"; do
    python -m pip download -q --no-deps --no-binary=:all: --no-build-isolation -d "$OUT.tmp" "${line%% *}" \
        2>&1 | grep -v "^WARNING: Location" || true
done

# fill the budget in priority order: the working tree first (what the call carries: tracked files and
# untracked ones git does not ignore), and 256 KiB to spare
tree=$( (git ls-files -z -co --exclude-standard | xargs -0 du -cb 2> /dev/null || true) | tail -n 1 | cut -f1)
left=$(( BUDGET_MIB * 1048576 - tree - 262144 ))
rm -rf "$OUT"
mkdir -p "$OUT"
echo "working tree: $(( tree / 1024 )) KiB; budget left for packages: $(( left / 1024 )) KiB"
for line in "${SDISTS[@]}" "${WHEELS[@]}"; do
    spec=${line%% *} why=${line#* }
    name=${spec%%==*} version=${spec##*==}
    pattern="$(echo "$name" | tr '-' '_' | tr '[:upper:]' '[:lower:]')-${version}"
    file=$(ls "$OUT.tmp" | tr '[:upper:]' '[:lower:]' | grep -n "^${pattern}[-.]" | head -n 1 | cut -d: -f1 || true)
    if [ -z "$file" ]; then
        file=$(ls "$OUT.tmp" | grep -i -n "^${name}-${version}[-.]" | head -n 1 | cut -d: -f1 || true)
    fi
    [ -n "$file" ] || { echo "MISSING $spec ($why): not downloaded"; continue; }
    path="$OUT.tmp/$(ls "$OUT.tmp" | sed -n "${file}p")"
    size=$(stat -c %s "$path")
    if [ "$size" -le "$left" ]; then
        mv "$path" "$OUT/"
        left=$(( left - size ))
        echo "carry   $(basename "$path") ($(( size / 1024 )) KiB): $why"
    else
        echo "TOO BIG $(basename "$path") ($(( size / 1024 )) KiB > $(( left / 1024 )) KiB left): not yet verified: $why"
    fi
done
rm -rf "$OUT.tmp"
echo "in $OUT: $(du -sh "$OUT" | cut -f1); carry it with the call (carry: [\"$OUT\"])"
