#!/usr/bin/env bash
# The `paper` preset on one GPU (issue 15), sized to one 10-minute lease: the short version of
# its whole loop (experiments/paper_short.toml through bench_design.py --runs 1), then, with the
# time left (20 s are kept for packing), XLA:GPU's own memory figures for the full preset's 10-run job (train_memory.py).
# The device's memory in use is logged every second (preallocation off, so the figure is what
# the job holds), and JAX logs every compile with its time. Everything lands in $OUT: the log,
# the memory trace, the results JSONs and the run directory packed small (no file over 4 MiB).
#
# Usage: OUT=DIR bash experiments/gpu_paper.sh TAG [SECONDS]    (e.g. TAG=h100, SECONDS=540)
# Needs the GPU build of jax and the project's dependencies; the checkout goes on PYTHONPATH.
set -u
tag=${1:?usage: gpu_paper.sh TAG [SECONDS]}
budget=${2:-540}
out=${OUT:-/tmp/gpu-paper}
mkdir -p "$out"
cd "$(dirname "$0")/.." || exit
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" XLA_PYTHON_CLIENT_PREALLOCATE=false
python=${PYTHON:-python3}
deadline=$((SECONDS + budget))
keep=$(mktemp -d)
stamp=$(mktemp)

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader -lms 1000 >"$out/gpu_memory.csv" &
smi=$!
pack() {
    kill "$smi" 2>/dev/null
    find experiments/results -name "*-paper-*$tag*.json" -newer "$stamp" -exec cp {} "$out"/ \;
    (cd "$keep" && find . -type f -printf '%s %p\n' | sort -k2 >"$out/run_files.txt" &&
        find . -type f -size -4M -print0 | tar czf "$out/paper_run.tar.gz" --null -T -)
    rm -rf "$keep" "$stamp"
}
trap pack EXIT

echo "== $(date +%T) the short paper loop (at most $((deadline - SECONDS - 20)) s)"
JAX_LOG_COMPILES=1 JAXRACE_RESULTS_TAG=paper-short-$tag timeout --kill-after=5 $((deadline - SECONDS - 20)) \
    "$python" experiments/bench_design.py --preset paper --config experiments/paper_short.toml --runs 1 \
    --keep "$keep" >"$out/design.log" 2>&1
echo "== exit $? at $(date +%T)"
grep -E "Finished XLA compilation of .* in [0-9]{2,}|Finished XLA compilation of .* in [2-9]\." "$out/design.log" |
    sed 's/.*Finished XLA compilation of //' | cut -c1-160
grep -v "Finished\|Compiling\|cache\|Persistent\|tracing" "$out/design.log" | tail -40
left=$((deadline - SECONDS - 15))
if ((left > 60)); then
    echo "== $(date +%T) train_memory of the full preset, 10 runs (at most $left s)"
    JAXRACE_RESULTS_TAG=paper-$tag timeout --kill-after=5 $left "$python" experiments/train_memory.py --preset paper \
        --runs 10 2>&1 | grep -v "Compiling\|cache" | tail -20
    echo "== exit ${PIPESTATUS[0]} at $(date +%T)"
fi
sort -t, -k2 -n "$out/gpu_memory.csv" | tail -1 | sed 's/^/peak memory used: /'
