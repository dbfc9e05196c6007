#!/usr/bin/env bash
# Issue 16 on one GPU: several train_reference.py runs (recipe E with policy averaging)
# side by side on the same device, each its own process, so a lease of minutes trains
# every seed at once. When a run ends, its log, JSON and saved actors go to $OUT as one
# NAME.tar.gz (a lease sends back at most 8 files, two folders deep).
#
# Usage: OUT=DIR MINUTES=6.5 bash experiments/gpu_reference.sh TAG SPEC [SPEC ...]
#   SPEC is TRACK:SEED (TRACK: gp, oval, or a centre-line CSV path). ../shared does not go to
#   a lent device: copy a circuit's two CSVs into a folder that .git/info/exclude ignores
#   (e.g. .tracks/) and carry it, never commit them.
#   Extra train_reference.py options go in $EXTRA (e.g. "--envs 128 --batch 1024").
# Size the runs for the lease: on an H100 with four runs at once, a 200-epoch chunk of 32
# envs takes about 2 s and a checkpoint evaluation 5-7 s (its first compile 43 s), so with
# few envs the evaluations take most of a short lease (raise --chunk-epochs or --eval-every).
# Results: experiments/results/train_reference-<track>-<TAG>-seed<SEED>.json.
# Needs the GPU build of jax and the project's dependencies; the checkout goes on PYTHONPATH.
set -u
tag=${1:?usage: gpu_reference.sh TAG TRACK:SEED ...}
shift
out=${OUT:-/tmp/gpu-reference}
minutes=${MINUTES:-6.5}
mkdir -p "$out"
cd "$(dirname "$0")/.." || exit
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# Every process takes a share of the GPU's memory instead of JAX's default 75% each.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-$(python3 -c "print(round(0.9 / $#, 3))")}
python=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
# The training budget plus the final assessments, compile and start-up.
limit=$(python3 -c "print(int(60 * $minutes + 150))")

one() {  # one TRACK SEED: a run under a time limit, then its results to $out
    local track=$1 seed=$2 short
    short=$(basename "$track" .csv | tr 'A-Z' 'a-z')
    [[ $short == brandshatch ]] && short=brands
    local name=$short-$tag-seed$seed work
    work=$(mktemp -d)
    # shellcheck disable=SC2086 (EXTRA is a list of options)
    timeout --kill-after=5 "$limit" "$python" experiments/train_reference.py --track "$track" --seed "$seed" \
        --minutes "$minutes" --pack-gap 25 --grid-prob 0.3 --ai-aggression varied --weight w_rear_end=100 \
        --weight w_collision=10 --train-course-out-margin 0.3 --actor-average 3e-4 ${EXTRA:-} \
        --save "$work/actors" --tag "$name" > "$work/$name.log" 2>&1
    echo "== $name: exit $?"
    cp experiments/results/train_reference-"$name".json "$work"/ 2>/dev/null
    tar -czf "$out/$name.tar.gz" -C "$work" .
    rm -rf "$work"
}

for spec in "$@"; do
    one "${spec%%:*}" "${spec##*:}" &
done
wait
