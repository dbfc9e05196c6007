#!/usr/bin/env bash
# The GPU figures (issue 18): pixels, env, training and reward-bank benchmarks on one GPU,
# sized to fit a 10-minute lease. Each results file is written as
# experiments/results/<bench>-TAG.json (JAXRACE_RESULTS_TAG), beside the CPU ones, and
# copied to $OUT after every step, so a step that runs out of time loses only itself.
#
# Usage: OUT=DIR bash experiments/gpu_figures.sh TAG [STEP ...]    (e.g. TAG=h100)
# STEP: pixels train rewards env pixels-large pixel-update (default: all, in that order).
# All of them take about 15 minutes on an H100; in 10-minute calls, run `rewards` alone
# (its 65 sandbox builds and 7 fused compiles took more than 225 s there) and the rest in one.
# Needs the GPU build of jax and the project's dependencies; the checkout goes on PYTHONPATH.
set -u
tag=${1:?usage: gpu_figures.sh TAG [STEP ...]}
shift
steps=" ${*:-pixels train rewards env pixels-large pixel-update} "
out=${OUT:-/tmp/gpu-figures}
mkdir -p "$out"
cd "$(dirname "$0")/.." || exit
export JAXRACE_RESULTS_TAG=$tag PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python=${PYTHON:-python3}
stamp=$(mktemp)  # only results written after this go to $out: a failed step sends nothing old
trap 'rm -f "$stamp"' EXIT

step() {  # step NAME SECONDS SCRIPT ARGS...: one benchmark under a time limit, then its results to $out
    [[ $steps == *" $1 "* ]] || return 0
    local limit=$2
    shift 2
    echo "== $(date +%T) ${*} (at most ${limit} s)"
    timeout --kill-after=5 "$limit" "$python" "$@" 2>&1 | grep -v "import warp\|import mujoco_warp"
    echo "== exit ${PIPESTATUS[0]}"
    find experiments/results -name "*-$tag*.json" -newer "$stamp" -exec cp {} "$out"/ \;
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
timeout 60 "$python" -c "import jax; print('jax', jax.__version__, jax.devices())"
# 5 M pixel frames/s is the target on one H100: the 64x64 chase camera with 7 opponents.
step pixels 120 experiments/bench_env.py --mode pixels --pixel-envs 1024 4096 16384 --steps 50 --repeats 3 \
    --car-racing-steps 0
# N = 5 runs in one job in at most 1.5x the time of N = 1.
step train 150 experiments/bench_train.py --parts 2 --runs 1 5 16 --epochs 300
step rewards 400 experiments/bench_rewards.py --envs 16384 --repeats 5
step env 60 experiments/bench_env.py --mode state --envs 4096 65536 --opponents 0 7 --steps 50 --repeats 3
# Larger pixel batches last, in a file of their own: one that does not fit costs nothing above.
JAXRACE_RESULTS_TAG=$tag-65536 step pixels-large 60 experiments/bench_env.py --mode pixels --pixel-envs 65536 --steps 20 \
    --repeats 3 --car-racing-steps 0
# One pixel-actor update alone against inside a scan (on XLA:CPU the scan is the slow case).
step pixel-update 90 experiments/bench_pixel_update.py --repeats 3
