#!/usr/bin/env bash
# The GPU check for a lent GPU machine (one GPU, CUDA torch, no network, nothing installed from this
# project): the package runs from the checkout (PYTHONPATH=python_backend), with python3.
#
#   bash benchmarks/device_check.sh OUT_DIR            # on the GPU machine; logs and JSON into OUT_DIR
#   bash benchmarks/device_check.sh --dry-run OUT_DIR  # print the plan, run gpu_check.py's dry run on the CPU
#
# Without CUDA it refuses to pass (exit 1), dry run included: a CPU run proves the scripts, not the GPU.
# OUT_DIR defaults to $OUT/device_check (when the device tool sets OUT), else benchmarks/results/device_check.
# Steps, each bounded by `timeout` and all by DEVICE_CHECK_BUDGET_S (default 300 s):
#   1. python3 benchmarks/gpu_check.py OUT_DIR        (graph == eager, GPU == CPU tokens, host syncs counted,
#                                                     reproducibility, bf16 share, chi-square of the candidate
#                                                     and dense graphs, the TensorRT-LLM processor in the
#                                                     stand-in engine loop on CUDA, CUDA-event latencies
#                                                     against a bandwidth floor: JSON; at most 200 s)
#   2. python3 benchmarks/trtllm_processor.py --device cuda --quick   (the processor's cost per request: JSON)
#   3. python3 benchmarks/sampler.py --device cuda --quick            (sampler microbenchmark: JSON)
#   4. python3 -m pytest tests/test_cuda_graph_sampler.py -m gpu      (the CUDA-graph sampler's GPU tests)
# summary.json in OUT_DIR says how each step ended.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 2
dry_run=0
out_dir=""
for arg in "$@"; do
    case $arg in
        --dry-run) dry_run=1 ;;
        -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
        -*) echo "unknown option: $arg (expected --dry-run)" >&2; exit 2 ;;
        *) [[ -n $out_dir ]] && { echo "one output folder, got '$out_dir' and '$arg'" >&2; exit 2; }; out_dir=$arg ;;
    esac
done
out_dir=${out_dir:-${OUT:-benchmarks/results}/device_check}

PYTHON=${PYTHON:-python3}
if ! command -v "$PYTHON" >/dev/null; then
    echo "device_check: FAILED: $PYTHON not found" >&2
    exit 1
fi
export PYTHONPATH="$PWD/python_backend${PYTHONPATH:+:$PYTHONPATH}"
budget=${DEVICE_CHECK_BUDGET_S:-300}
deadline=$((SECONDS + budget))
failed=()
results=()

if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
    echo "device_check: FAILED: $PYTHON cannot import torch (set PYTHON to an interpreter that can)" >&2
    exit 1
fi
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
    timeout -k 10 "$limit" "$@" 2>&1 | tee "$out_dir/$name.log"
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
mkdir -p "$out_dir"
step gpu-check 200 -- "$PYTHON" benchmarks/gpu_check.py --budget-s 190 "$out_dir"
step processor-bench 60 -- "$PYTHON" benchmarks/trtllm_processor.py --device cuda --quick --json "$out_dir/trtllm_processor_cuda.json"
step sampler-bench 60 -- "$PYTHON" benchmarks/sampler.py --device cuda --quick --json "$out_dir/sampler_cuda.json"
if [[ $dry_run == 0 ]] && ! "$PYTHON" -c 'import pytest' 2>/dev/null; then
    echo "[gpu-tests] skipped: pytest is not installed (gpu_check.py runs the same checks)"
    results+=("\"gpu-tests\": \"skipped: no pytest\"")
else
    step gpu-tests 120 -- "$PYTHON" -m pytest tests/test_cuda_graph_sampler.py -m gpu -q -p no:cacheprovider --noconftest
fi

if [[ $dry_run == 1 ]]; then
    echo "[gpu-check --dry-run] running gpu_check.py's code on the CPU at small sizes:"
    "$PYTHON" benchmarks/gpu_check.py --dry-run "$out_dir" 2>&1 | tee "$out_dir/gpu-check-dry-run.log"
    if [[ $cuda == 0 ]]; then
        echo "device_check: dry run: no CUDA device here, so the check refuses to pass" >&2
        exit 1
    fi
    echo "device_check: dry run: CUDA present, the plan above would run"
    exit 0
fi
(IFS=,; echo "{${results[*]}, \"seconds\": $SECONDS}") > "$out_dir/summary.json"
if ((${#failed[@]})); then
    echo "device_check: FAILED: ${failed[*]} (logs in $out_dir)"
    exit 1
fi
echo "device_check: done in ${SECONDS}s (logs and JSON in $out_dir)"
