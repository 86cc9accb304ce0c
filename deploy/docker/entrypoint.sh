#!/usr/bin/env bash
# zerocheck container entrypoint.
#
# 1. Builds the artifacts (tokenizer, decoder weights, ONNX) and the GPU engine with
#    `zerocheck build` when they are missing or were built for another GPU model.
# 2. runs tritonserver (its HTTP endpoint on an internal loopback port) and zerocheck's front end: the
#    guarded door to Triton's HTTP on the public HTTP port, and the OpenAI API; it exits when either
#    exits (the orchestrator restarts the container) and passes SIGTERM/SIGINT on to both.
#
# Environment (defaults in brackets):
#   ZEROCHECK_ENGINE       auto | tensorrt | none   [auto: tensorrt when a GPU is visible and tensorrt imports, else none]
#   ZEROCHECK_BUILD_ARGS   extra arguments for `zerocheck build`   []
#   ZEROCHECK_SKIP_BUILD   1: never run `zerocheck build`          [0]
#   ZEROCHECK_ARTIFACTS    artifact directory (build --out; read by the models) [$ZEROCHECK_HOME/artifacts]
#   TRITON_MODEL_REPOSITORY  path or s3://, gs://, as:// URL       [the installed package's: `zerocheck paths`]
#   TRITON_{HTTP,GRPC,METRICS}_{ADDRESS,PORT}                      [0.0.0.0, 8000/8001/8002]
#                          (the HTTP address and port are the front end's door; Triton's own HTTP
#                          endpoint binds 127.0.0.1:$ZEROCHECK_TRITON_HTTP_PORT)
#   ZEROCHECK_TRITON_HTTP_PORT  Triton's internal HTTP port        [8080]
#   ZEROCHECK_OPENAI_PORT  the OpenAI API's port, or "none"        [9000]
#   ZEROCHECK_MAX_BODY_BYTES  largest HTTP request body (413 above; below 4 MiB) [2097152]
#   ZEROCHECK_ADMIN_KEY / ZEROCHECK_ADMIN_KEY_FILE  key for the restricted APIs [random: locked]
#   ZEROCHECK_ADMIN_KEY_HEADER   header carrying the key           [admin-key]
#   ZEROCHECK_RESTRICTED_APIS    comma list, or "none"             [model-repository,shared-memory,trace,logging]
#   ZEROCHECK_DRY_RUN      1: print the plan and the tritonserver command, run nothing   [0]
# Arguments starting with "-" are appended to tritonserver's; any other command is exec'd as is.
# ZEROCHECK_DRY_RUN=1 prints "exec: tritonserver ..." and "frontend: python3 -m zerocheck.frontend ...".
set -euo pipefail

ZEROCHECK_HOME=${ZEROCHECK_HOME:-/opt/zerocheck}
# The models read ZEROCHECK_ARTIFACTS; `zerocheck build` writes there (--out).
export ZEROCHECK_ARTIFACTS=${ZEROCHECK_ARTIFACTS:-$ZEROCHECK_HOME/artifacts}
# model stubs share the cores: OpenMP threads that spin after each op take the CPU from the next model
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
ARTIFACTS=$ZEROCHECK_ARTIFACTS
DRY_RUN=${ZEROCHECK_DRY_RUN:-0}

log() { echo "[zerocheck-entrypoint] $*" >&2; }

if [[ $# -gt 0 && $1 != -* ]]; then
    exec "$@"
fi

gpu_name() {
    command -v nvidia-smi >/dev/null 2>&1 || return 1
    nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | grep .
}

choose_engine() {
    local requested=${ZEROCHECK_ENGINE:-auto} gpu=$1
    case $requested in
        none) echo none ;;
        tensorrt)
            if [[ -z $gpu ]]; then
                log "ZEROCHECK_ENGINE=$requested needs a GPU and none is visible (nvidia-smi)"
                return 2
            fi
            echo "$requested" ;;
        auto)
            if [[ -z $gpu ]]; then echo none
            elif python3 -c 'import tensorrt' >/dev/null 2>&1; then echo tensorrt
            else echo none; fi ;;
        *)
            log "ZEROCHECK_ENGINE must be auto, tensorrt or none; got '$requested'"
            return 2 ;;
    esac
}

build_artifacts() {
    local gpu engine stamp flags=(--out "$ARTIFACTS")
    gpu=$(gpu_name || true)
    engine=$(choose_engine "$gpu") || exit 2
    [[ $engine != none ]] && flags+=("--$engine")
    # Engines only run on the GPU model they were built for: the stamp records it.
    stamp="$ARTIFACTS/.zerocheck-built-$engine"
    if [[ -f $stamp && $(<"$stamp") == "${gpu:-cpu}" ]]; then
        log "artifacts present for engine=$engine on '${gpu:-cpu}' ($stamp): skipping build"
        return 0
    fi
    # Built for another GPU model: rebuild even though `zerocheck build` finds its files up to date.
    [[ -f $stamp ]] && flags+=(--force)
    # shellcheck disable=SC2206  # ZEROCHECK_BUILD_ARGS is a space-separated list
    local cmd=(zerocheck build "${flags[@]}" ${ZEROCHECK_BUILD_ARGS:-})
    log "building artifacts: engine=$engine gpu='${gpu:-none}'"
    if [[ $DRY_RUN == 1 ]]; then
        echo "build: ${cmd[*]}"
        return 0
    fi
    mkdir -p "$ARTIFACTS"
    # Replicas sharing one artifacts volume build once: the others wait on the lock.
    (
        flock 9
        if [[ -f $stamp && $(<"$stamp") == "${gpu:-cpu}" ]]; then exit 0; fi
        "${cmd[@]}"
        echo "${gpu:-cpu}" >"$stamp"
    ) 9>"$ARTIFACTS/.build.lock"
}

admin_key() {
    if [[ -n ${ZEROCHECK_ADMIN_KEY:-} ]]; then
        log "admin key from ZEROCHECK_ADMIN_KEY"
        printf '%s' "$ZEROCHECK_ADMIN_KEY"
    elif [[ -n ${ZEROCHECK_ADMIN_KEY_FILE:-} && -r $ZEROCHECK_ADMIN_KEY_FILE ]]; then
        log "admin key from $ZEROCHECK_ADMIN_KEY_FILE"
        tr -d '\r\n' <"$ZEROCHECK_ADMIN_KEY_FILE"
    else
        log "no admin key given: the restricted APIs are locked with a random key"
        python3 -c 'import secrets; print(secrets.token_hex(32), end="")'
    fi
}

if [[ ${ZEROCHECK_SKIP_BUILD:-0} != 1 ]]; then
    build_artifacts
fi

internal_http=${ZEROCHECK_TRITON_HTTP_PORT:-8080}
args=(
    "--model-repository=${TRITON_MODEL_REPOSITORY:-$(zerocheck paths model-repository)}"
    "--http-address=127.0.0.1" "--http-port=$internal_http"
    "--grpc-address=${TRITON_GRPC_ADDRESS:-0.0.0.0}" "--grpc-port=${TRITON_GRPC_PORT:-8001}"
    "--metrics-address=${TRITON_METRICS_ADDRESS:-0.0.0.0}" "--metrics-port=${TRITON_METRICS_PORT:-8002}"
    "--grpc-header-forward-pattern=zerocheck.*"
    "--metrics-config=summary_latencies=true"
)
restricted=${ZEROCHECK_RESTRICTED_APIS:-model-repository,shared-memory,trace,logging}
if [[ $restricted != none ]]; then
    key=$(admin_key)
    header=${ZEROCHECK_ADMIN_KEY_HEADER:-admin-key}
    args+=("--http-restricted-api=$restricted:$header=$key" "--grpc-restricted-protocol=$restricted:$header=$key")
fi

frontend=(
    python3 -m zerocheck.frontend "--url=127.0.0.1:${TRITON_GRPC_PORT:-8001}"
    "--host=${TRITON_HTTP_ADDRESS:-0.0.0.0}" "--door-port=${TRITON_HTTP_PORT:-8000}"
    "--triton-http-url=http://127.0.0.1:$internal_http" "--artifacts=$ARTIFACTS"
    "--max-body-bytes=${ZEROCHECK_MAX_BODY_BYTES:-2097152}"
)
openai=${ZEROCHECK_OPENAI_PORT:-9000}
if [[ $openai == none ]]; then frontend+=(--no-openai); else frontend+=("--port=$openai"); fi

if [[ $DRY_RUN == 1 ]]; then
    shown="tritonserver ${args[*]} $*"
    [[ -n ${key:-} ]] && shown=${shown//"$key"/<redacted-${#key}-chars>}
    echo "exec: $shown"
    echo "frontend: ${frontend[*]}"
    exit 0
fi
tritonserver "${args[@]}" "$@" &
triton_pid=$!
"${frontend[@]}" &
frontend_pid=$!
trap 'kill -TERM "$triton_pid" "$frontend_pid" 2>/dev/null' TERM INT
status=0
wait -n "$triton_pid" "$frontend_pid" || status=$?
log "a process exited (status $status): stopping the other"
kill -TERM "$triton_pid" "$frontend_pid" 2>/dev/null || true
wait "$triton_pid" "$frontend_pid" 2>/dev/null || true
exit "$status"
