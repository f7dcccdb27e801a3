#!/usr/bin/env bash
# Open the Prefect UI on the demo's database (the finished runs, their artifacts and events), on any
# port (`make ui PORT=4213`), and print where the newest run's report is: its page in the UI (the
# report artifact and its flow run) and its report.md. Ctrl-C stops the server.
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=${PORT:-4200} HOST=127.0.0.1
RUNS=${QS_RUNS_DIR:-runs}
export PREFECT_HOME="$PWD/.demo/prefect"
# the settings of every Prefect server the product starts (quantize_serve/local_api.py: telemetry off)
server_env=$(.venv/bin/python -m quantize_serve.local_api)
# shellcheck disable=SC2086  # KEY=VALUE words
export $server_env
[ -d "$PREFECT_HOME" ] || echo "ui: no demo database yet (\`make demo\` makes one): an empty one in $PREFECT_HOME"
mkdir -p "$PREFECT_HOME"
# The UI's browser code calls the API at PREFECT_UI_API_URL, which otherwise follows PREFECT_API_URL
# or the server's port *setting* (4200), not `--port`: all three name this port.
export PREFECT_SERVER_API_HOST=$HOST PREFECT_SERVER_API_PORT=$PORT
export PREFECT_API_URL="http://$HOST:$PORT/api" PREFECT_UI_API_URL="http://$HOST:$PORT/api"

.venv/bin/prefect server start --host "$HOST" --port "$PORT" &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true' INT TERM EXIT

for _ in $(seq 600); do  # about 10 s here; a first start (no database yet) migrates it: a minute or more
  .venv/bin/python -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" \
    "http://$HOST:$PORT/api/health" 2>/dev/null && break
  kill -0 "$server" 2>/dev/null || { echo "ui: the Prefect server did not start (its output is above)" >&2; exit 1; }
  sleep 0.5
done

# The newest report artifact (key <recipe>-report) in this database, and the newest report.md on disk.
.venv/bin/python - "http://$HOST:$PORT" "$RUNS" <<'PYEOF' || true
import json, sys, urllib.request
from pathlib import Path
base, runs = sys.argv[1], Path(sys.argv[2])
body = {"artifacts": {"key": {"like_": "%-report"}, "type": {"any_": ["markdown"]}},
        "sort": "CREATED_DESC", "limit": 1}
req = urllib.request.Request(f"{base}/api/artifacts/filter", data=json.dumps(body).encode(),
                             headers={"Content-Type": "application/json"})
try:
    found = json.load(urllib.request.urlopen(req, timeout=10))
except OSError as exc:
    found, why = [], f" (the API did not answer: {exc})"
else:
    why = " (no run in this database yet: `make demo` makes one)"
if found:
    a = found[0]
    print(f"newest report: {base}/artifacts/artifact/{a['id']}  ({a['key']}, {a['created'][:19]})")
    if a.get("flow_run_id"):
        print(f"its flow run:  {base}/runs/flow-run/{a['flow_run_id']}")
else:
    print(f"newest report: none in the UI{why}")
reports = sorted(runs.glob("*/report.md"), key=lambda p: p.stat().st_mtime)
if reports:
    print(f"report file:   {reports[-1]}")
PYEOF
echo "Prefect UI: http://$HOST:$PORT  (Ctrl-C to stop)"
wait "$server"
