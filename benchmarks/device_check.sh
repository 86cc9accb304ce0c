#!/usr/bin/env bash
# The GPU check for a lent GPU machine (one GPU, CUDA torch, no network, nothing installed from this
# project): the package runs from the checkout (PYTHONPATH), only the GPU test module is collected.
#
#   bash benchmarks/device_check.sh            # on the GPU machine
#   bash benchmarks/device_check.sh --dry-run  # print the plan and probe CUDA; run nothing
#
# Without CUDA it refuses to pass (exit 1), dry run included: a CPU fallback would prove nothing.
# Steps, each bounded by `timeout` and all by DEVICE_CHECK_BUDGET_S (default 420 s):
#   1. pytest tests/test_cuda_graph_sampler.py -m gpu     (the CUDA-graph sampler's GPU tests)
#   2. python benchmarks/gpu_check.py                     (graph == eager, host syncs, reproducibility,
#                                                          bf16 share, chi-square, latencies: JSON)
#   3. python benchmarks/sampler.py --device cuda --quick (sampler microbenchmark: JSON)
# Logs and JSON go to $OUT/device_check (when the device tool sets OUT) or benchmarks/results/device_check;
# summary.json there says how each step ended.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 2
dry_run=0
for arg in "$@"; do
    case $arg in
        --dry-run) dry_run=1 ;;
        -h | --help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "unknown argument: $arg (expected --dry-run)" >&2; exit 2 ;;
    esac
done

PYTHON=${PYTHON:-$(command -v python || command -v python3)}
export PYTHONPATH="$PWD/python_backend:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
budget=${DEVICE_CHECK_BUDGET_S:-420}
deadline=$((SECONDS + budget))
log_dir=${OUT:-benchmarks/results}/device_check
failed=()
results=()

if "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    cuda=1
    "$PYTHON" -c 'import torch; print("device_check: torch", torch.__version__, "cuda", torch.version.cuda, "on", torch.cuda.get_device_name(0))'
else
    cuda=0
fi

# step NAME LIMIT_S -- COMMAND...: run one bounded step (or, in a dry run, say what would run).
step() {
    local name=$1 limit=$2
    shift 3
    local left=$((deadline - SECONDS))
    ((limit > left)) && limit=$left
    if [[ $dry_run == 1 ]]; then
        echo "[$name] would run (timeout ${limit}s): $*"
        return
    fi
    if ((limit < 10)); then
        echo "[$name] not run: the budget of ${budget}s is spent"
        failed+=("$name"); results+=("\"$name\": \"budget spent\"")
        return
    fi
    echo "[$name] running (timeout ${limit}s): $*"
    local start=$SECONDS rc
    timeout -k 10 "$limit" "$@" 2>&1 | tee "$log_dir/$name.log"
    rc=${PIPESTATUS[0]}
    if ((rc == 0)); then
        echo "[$name] ok in $((SECONDS - start))s"
        results+=("\"$name\": \"ok\"")
    else
        ((rc == 124 || rc == 137)) && echo "[$name] timed out after ${limit}s" || echo "[$name] failed: exit $rc"
        failed+=("$name"); results+=("\"$name\": \"exit $rc\"")
    fi
}

if [[ $cuda == 0 && $dry_run == 0 ]]; then
    echo "device_check: FAILED: torch sees no CUDA device; this check only passes on a GPU" >&2
    exit 1
fi
[[ $dry_run == 0 ]] && mkdir -p "$log_dir"
if [[ $dry_run == 0 ]] && ! "$PYTHON" -c 'import pytest' 2>/dev/null; then
    echo "[gpu-tests] skipped: pytest is not installed (gpu_check.py runs the same checks)"
    results+=("\"gpu-tests\": \"skipped: no pytest\"")
else
step gpu-tests 150 -- "$PYTHON" -m pytest tests/test_cuda_graph_sampler.py -m gpu -q -p no:cacheprovider --noconftest
fi
step gpu-check 180 -- "$PYTHON" benchmarks/gpu_check.py --out "$log_dir"
step sampler-bench 90 -- "$PYTHON" benchmarks/sampler.py --device cuda --quick --json "$log_dir/sampler_cuda.json"

if [[ $dry_run == 1 ]]; then
    if [[ $cuda == 0 ]]; then
        echo "device_check: dry run: no CUDA device here, so the check would refuse to pass" >&2
        exit 1
    fi
    echo "device_check: dry run: CUDA present, the plan above would run"
    exit 0
fi
(IFS=,; echo "{${results[*]}, \"seconds\": $SECONDS}") > "$log_dir/summary.json"
if ((${#failed[@]})); then
    echo "device_check: FAILED: ${failed[*]} (logs in $log_dir)"
    exit 1
fi
echo "device_check: done in ${SECONDS}s (logs and JSON in $log_dir)"
