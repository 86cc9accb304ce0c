#!/usr/bin/env bash
# GPU check for a lent GPU machine (e.g. one H200 with CUDA torch; no TensorRT needed).
#
#   bash benchmarks/device_check.sh            # on the GPU machine
#   bash benchmarks/device_check.sh --dry-run  # print the plan only (runs one trivial command)
#
# Steps, each bounded by `timeout` and by a total budget (DEVICE_CHECK_BUDGET_S, default 450 s):
#   1. pytest tests -m gpu -q                                  (CUDA-graph sampler tests)
#   2. python benchmarks/sampler.py --device cuda              (sampler microbenchmark)
#   3. python benchmarks/sampler_baselines.py --device cuda    (FlashInfer-style / sort-based baselines)
# Without a CUDA device the GPU-only step 1 is skipped ("skipped: no CUDA device") and the
# benchmarks run with --device cpu; the script then exits 0 unless a step that ran failed.
# Logs go to $OUT/device_check (when the device tool sets OUT) or benchmarks/results/device_check.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 2
dry_run=0
for arg in "$@"; do
    case $arg in
        --dry-run) dry_run=1 ;;
        -h | --help) sed -n '2,14p' "$0"; exit 0 ;;
        *) echo "unknown argument: $arg (expected --dry-run)" >&2; exit 2 ;;
    esac
done

PYTHON=${PYTHON:-$(command -v python || command -v python3)}
budget=${DEVICE_CHECK_BUDGET_S:-450}
deadline=$((SECONDS + budget))
log_dir=${OUT:-benchmarks/results}/device_check
failed=()

if [[ $dry_run == 1 ]]; then
    device="cuda (if present) or cpu"
    echo "device_check: dry run: the plan only, CUDA not probed; python: $("$PYTHON" -c 'import sys; print(sys.version.split()[0])')"
elif "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    device=cuda
    "$PYTHON" -c 'import torch; print("device_check: torch", torch.__version__, "cuda", torch.version.cuda, "on", torch.cuda.get_device_name(0))'
else
    device=cpu
    echo "device_check: no CUDA device: running on CPU"
fi

# step NAME LIMIT_S GPU_ONLY FILE -- COMMAND...: run one bounded step, or say why not.
step() {
    local name=$1 limit=$2 gpu_only=$3 file=$4
    shift 5
    local left=$((deadline - SECONDS))
    ((limit > left)) && limit=$left
    if [[ -n $file && ! -f $file ]]; then
        echo "[$name] skipped: $file not found"
    elif [[ $dry_run == 1 ]]; then
        local when=""
        [[ $gpu_only == 1 ]] && when=" with CUDA (without: skipped: no CUDA device)"
        echo "[$name] would run$when (timeout ${limit}s): $*"
    elif [[ $gpu_only == 1 && $device != cuda ]]; then
        echo "[$name] skipped: no CUDA device"
    elif ((limit < 10)); then
        echo "[$name] skipped: total budget of ${budget}s spent"
    else
        mkdir -p "$log_dir"
        echo "[$name] running (timeout ${limit}s): $*"
        local start=$SECONDS rc
        timeout -k 10 "$limit" "$@" 2>&1 | tee "$log_dir/$name.log"
        rc=${PIPESTATUS[0]}
        if ((rc == 0)); then
            echo "[$name] ok in $((SECONDS - start))s"
        elif ((rc == 5)) && [[ $1 == "$PYTHON" && ${2:-} == -m && ${3:-} == pytest ]]; then
            echo "[$name] skipped: pytest collected no test"
        else
            ((rc == 124 || rc == 137)) && echo "[$name] timed out after ${limit}s" || echo "[$name] failed: exit $rc"
            failed+=("$name")
        fi
    fi
}

step gpu-tests 200 1 "" -- "$PYTHON" -m pytest tests -m gpu -q
step sampler-bench 150 0 benchmarks/sampler.py -- "$PYTHON" benchmarks/sampler.py --device "${device%% *}"
step sampler-baselines 100 0 benchmarks/sampler_baselines.py -- "$PYTHON" benchmarks/sampler_baselines.py --device "${device%% *}"

if ((${#failed[@]})); then
    echo "device_check: FAILED: ${failed[*]} (logs in $log_dir)"
    exit 1
fi
echo "device_check: done on $device in ${SECONDS}s"
