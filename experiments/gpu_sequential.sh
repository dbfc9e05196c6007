#!/usr/bin/env bash
# Whether a job's runs one after another (TrainConfig.sequential_runs) beat vmapped runs on a GPU
# (issue 15), sized to about 5 minutes of one lease: the paper encoder's value and gradient over
# 1,696 frames per run (bench_run_conv.py: vmapped against one run at a time, unrolled, ...), then
# the short paper preset's epoch split by program, vmapped against one after another
# (epoch_split.py). On this project's 2-core CPU one after another took 2.5x less time per epoch
# of the pixel actor; the loop turns it on there only. Results land in experiments/results with
# the tag in their names, and are copied to $OUT.
#
# Usage: OUT=DIR bash experiments/gpu_sequential.sh TAG [SECONDS]    (e.g. TAG=h100, SECONDS=420)
# Needs the GPU build of jax and the project's dependencies; the checkout goes on PYTHONPATH.
set -u
tag=${1:?usage: gpu_sequential.sh TAG [SECONDS]}
budget=${2:-420}
out=${OUT:-/tmp/gpu-sequential}
mkdir -p "$out"
cd "$(dirname "$0")/.." || exit
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python=${PYTHON:-python3}
deadline=$((SECONDS + budget))
stamp=$(mktemp)
trap 'find experiments/results -name "*-$tag*.json" -newer "$stamp" -exec cp {} "$out"/ \; ; rm -f "$stamp"' EXIT

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
echo "== $(date +%T) bench_run_conv, 1696 frames per run (at most 150 s)"
JAXRACE_RESULTS_TAG=$tag timeout --kill-after=5 150 "$python" experiments/bench_run_conv.py --frames 1696 \
    --runs 1 2 4 2>&1 | tail -25
left=$((deadline - SECONDS - 10))
echo "== $(date +%T) epoch_split, the short paper preset, vmapped and one after another (at most $left s)"
JAXRACE_RESULTS_TAG=paper-short-$tag-sequential timeout --kill-after=5 $left "$python" experiments/epoch_split.py \
    --preset paper --config experiments/paper_short.toml --variants preset sequential 2>&1 |
    grep -v "Compiling\|cache" | tail -12
echo "== exit ${PIPESTATUS[0]} at $(date +%T)"
