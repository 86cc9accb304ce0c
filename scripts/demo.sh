#!/usr/bin/env bash
# Set up, build the demo artifacts if missing, serve the model repository on 127.0.0.1, stream one
# generation and stop (`zerocheck serve --demo`). Extra arguments go to `zerocheck serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
. .venv/bin/activate
exec zerocheck serve --demo "$@"
