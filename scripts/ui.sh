#!/usr/bin/env bash
# Open the Prefect UI on the demo's database (the finished runs, their artifacts and events).
set -euo pipefail
cd "$(dirname "$0")/.."
export PREFECT_HOME="$PWD/.demo/prefect" PREFECT_SERVER_ANALYTICS_ENABLED=false
PORT=${PORT:-4200}
echo "Prefect UI: http://127.0.0.1:$PORT  (Ctrl-C to stop)"
exec .venv/bin/prefect server start --host 127.0.0.1 --port "$PORT"
