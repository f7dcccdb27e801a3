#!/usr/bin/env bash
# Steps run ON the GPU host, from the checkout (see scripts/gpu/README.md). Jobs run detached, so no
# single command (or connection) has to outlast them; their state lives in $QS_GPU_STATE
# (default /tmp/qs-h200). Liveness comes from files the job writes, never from a PID seen by another
# command: JOB.heartbeat (touched every 10 s while it runs) and JOB.rc (its exit code, written at exit).
#
#   bash scripts/gpu/host.sh receive CHUNK_DIR [PARTS_DIR]  copy one piece of the wheelhouse into PARTS_DIR
#                                                           (default /tmp/qs-parts); says how many are there
#   bash scripts/gpu/host.sh freeze                         print the host python3's packages (and keep them
#                                                           in STATE/host-freeze.txt for collect)
#   bash scripts/gpu/host.sh start JOB COMMAND...           run COMMAND detached (one job at a time)
#   bash scripts/gpu/host.sh status JOB [WAIT_S]            wait up to WAIT_S for JOB to end; its state and
#                                                           the last lines of its log
#   bash scripts/gpu/host.sh launch [NAME] [ARGS...]        start the scenario benchmarks/scenarios/NAME.yaml (default
#                                                           h200) through benchmarks/run.py, as job NAME (or its
#                                                           `job`): its result in STATE, first seeded from the
#                                                           checkout's benchmarks/results/ when it resumes; ARGS go
#                                                           to its driver. `benchmarks/run.py --list` lists them
#   bash scripts/gpu/host.sh launch-NAME [ARGS...]          the same (launch-shapes, launch-peak, launch-moe, ...)
#                                                           Where .venv is missing, or the scenario says `setup: first`
#                                                           (gpu-smoke), the job runs `make setup` first (QS_WHEELHOUSE
#                                                           as given; a no-op when done), its seconds in STATE/setup.times
#   bash scripts/gpu/host.sh collect DEST                   copy results, logs and the freeze to DEST
# The benchmarks run from the project's environments (`make setup` first): .venv/bin/python, and
# .venv-serve for vLLM (the package's default serving Python).
set -u
cd "$(dirname "$0")/../.."
STATE=${QS_GPU_STATE:-/tmp/qs-h200}
mkdir -p "$STATE"
HEARTBEAT_S=10 LOST_AFTER_S=60

age() { echo $(( $(date +%s) - $(stat -c %Y "$1") )); }

job_state() {  # job_state JOB: finished RC | running AGE | lost AGE | none
  local j=$STATE/$1
  if [ -f "$j.rc" ]; then echo "finished $(cat "$j.rc")"
  elif [ -f "$j.heartbeat" ]; then
    local a; a=$(age "$j.heartbeat")
    if [ "$a" -le "$LOST_AFTER_S" ]; then echo "running $a"; else echo "lost $a"; fi
  else echo none; fi
}

start_job() {  # start_job JOB COMMAND...
  local job=$1; shift
  for hb in "$STATE"/*.heartbeat; do
    [ -e "$hb" ] || continue
    local other; other=$(basename "$hb" .heartbeat)
    if [ "$(job_state "$other" | cut -d' ' -f1)" = running ]; then
      echo "host.sh: job $other is still running (heartbeat $(age "$hb") s ago); one job at a time on the GPU" >&2
      exit 1
    fi
  done
  rm -f "$STATE/$job.rc" "$STATE/$job.heartbeat"
  echo "$(date -u +%FT%TZ) $*" > "$STATE/$job.started"
  touch "$STATE/$job.heartbeat"
  # The wrapper touches the heartbeat while COMMAND runs and writes its exit code when it ends.
  setsid nohup sh -c '
    hb=$1; rcf=$2; every=$3; shift 3
    ( while :; do touch "$hb"; sleep "$every"; done ) & beat=$!
    "$@"; rc=$?
    kill "$beat" 2>/dev/null; echo "$rc" > "$rcf"
  ' sh "$STATE/$job.heartbeat" "$STATE/$job.rc" "$HEARTBEAT_S" "$@" \
    > "$STATE/$job.log" 2>&1 < /dev/null &
  echo "job $job started: $*  (log $STATE/$job.log; bash scripts/gpu/host.sh status $job [WAIT_S])"
}

export PYTHONUNBUFFERED=1 PATH="$PWD/.venv/bin:$PATH"  # the pipeline environment's python and prefect
need_setup() {
  [ -x .venv/bin/python ] || { echo "host.sh: no .venv here: run 'QS_WHEELHOUSE=DIR make setup' first" >&2; exit 1; }
}
scenario_key() {  # scenario_key FILE KEY: a top-level scalar of a scenario file, read without the .venv
  sed -n "s/^$2: *\([^ #]*\).*/\1/p" "$1" | head -n 1
}

case "${1:-}" in
receive)
  parts=${3:-/tmp/qs-parts}; mkdir -p "$parts"
  cp "${2:?chunk folder}"/* "$parts"/ || exit 1
  n=$(ls "$parts" | grep -c 'part-' || true)
  total=$(grep -c 'part-' "$parts/SHA256SUMS" 2>/dev/null || echo "?")
  echo "pieces in $parts: $n of $total"
  ;;
freeze)
  python3 -m pip list --format=freeze 2>/dev/null | tee "$STATE/host-freeze.txt"
  echo "# python3 = $(command -v python3) ($(python3 -c 'import sys; print(sys.version.split()[0])'))" \
    | tee -a "$STATE/host-freeze.txt"
  ;;
start)
  job=${2:?job name}; shift 2
  [ $# -gt 0 ] || { echo "host.sh: start JOB COMMAND..." >&2; exit 2; }
  start_job "$job" "$@"
  ;;
status)
  job=${2:?job name}; limit=${3:-0}; t0=$SECONDS
  while [ "$(job_state "$job" | cut -d' ' -f1)" = running ] && [ $((SECONDS - t0)) -lt "$limit" ]; do sleep 3; done
  set -- $(job_state "$job")
  case $1 in
    finished) echo "job $job: finished, exit code $2 ($(cat "$STATE/$job.started" 2>/dev/null | cut -d' ' -f1) start)" ;;
    running) echo "job $job: running (heartbeat $2 s ago; waited $((SECONDS - t0)) s)" ;;
    lost) echo "job $job: lost (no heartbeat for $2 s and no exit code: killed, or the host restarted)" ;;
    none) echo "job $job: never started here"; exit 1 ;;
  esac
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader 2>/dev/null || true
  log=$STATE/$job.log
  # every stage the flow has finished so far, whatever the tail below shows: a host lost between two
  # status calls still leaves the run's stages in the last call's output
  grep -a -E 'stage [a-z0-9 ()-]+ done in ' "$log" 2>/dev/null | sed 's/^/  done: /' | cut -c1-200 || true
  # the drivers' own lines, Prefect's log lines, and `prefect deployment run --watch`'s (▪ log, ● event)
  if grep -a -q -E '^\[([a-z0-9_-]+ )?[0-9:]{8}\]|^\[run\]|\| (INFO|WARNING|ERROR) |^(▪|●) ' "$log" 2>/dev/null; then
    grep -a -E '^\[([a-z0-9_-]+ )?[0-9:]{8}\]|^\[run\]|\| (INFO|WARNING|ERROR) |^(▪|●) ' "$log" | cut -c1-300 | tail -n 45
  else
    tail -n 45 "$log" 2>/dev/null | cut -c1-300
  fi
  ;;
launch|launch-*)
  name=${1#launch}; name=${name#-}; shift
  if [ -z "$name" ]; then
    name=h200
    if [ $# -gt 0 ] && [ "$1" != shared ] && [ -f "benchmarks/scenarios/$1.yaml" ]; then name=$1; shift; fi
  fi
  scenario=benchmarks/scenarios/$name.yaml
  [ "$name" != shared ] && [ -f "$scenario" ] || {  # shared.yaml: the scenarios' shared settings, no scenario
    echo "host.sh: no scenario $name; known: $(ls benchmarks/scenarios | grep -vx shared.yaml | sed 's/\.yaml$//' | tr '\n' ' ')" >&2
    exit 2
  }
  job=$(scenario_key "$scenario" job); job=${job:-$name}
  if [ "$(scenario_key "$scenario" setup)" = first ] || [ ! -x .venv/bin/python ]; then
    # set-up inside the job, before the driver's interpreter exists (or is replaced)
    start_job "$job" bash scripts/gpu/host.sh setup-then .venv/bin/python benchmarks/run.py "$name" \
      --state "$STATE" "$@"
  else
    start_job "$job" .venv/bin/python benchmarks/run.py "$name" --state "$STATE" "$@"
  fi
  ;;
setup-then)  # (inside a job) make setup, timed, then COMMAND if it succeeded
  shift
  t0=$(date +%s) started=$(date -u +%FT%TZ)
  echo "[setup $(date +%T)] make setup (QS_WHEELHOUSE=${QS_WHEELHOUSE:-none})"
  make setup 2>&1 | tee "$STATE/setup.log" | while IFS= read -r line; do echo "[setup $(date +%T)] $line"; done
  rc=${PIPESTATUS[0]}
  echo "$started $(( $(date +%s) - t0 )) $rc" >> "$STATE/setup.times"
  echo "[setup $(date +%T)] make setup: exit code $rc in $(( $(date +%s) - t0 )) s"
  [ "$rc" -eq 0 ] || exit "$rc"
  need_setup
  exec "$@"
  ;;
collect)
  DEST=${2:?destination folder}; mkdir -p "$DEST"
  .venv/bin/python benchmarks/run.py --collect "$DEST" --state "$STATE" >/dev/null  # every scenario's result
  for f in "$STATE"/*.json "$STATE"/runs.jsonl "$STATE"/host-freeze.txt "$STATE"/llama3-watch.log "$STATE"/*.rc "$STATE"/*.started; do
    [ -f "$f" ] && cp "$f" "$DEST/"
  done
  for f in "$STATE"/*.log; do [ -f "$f" ] && tail -c 4000000 "$f" > "$DEST/$(basename "$f")"; done
  cp .cache/test_durations.json "$DEST/" 2>/dev/null || true  # make test's, here
  (cd "$STATE" && tar -czf "$DEST/logs.tar.gz" --exclude='*.safetensors' --exclude='*.parquet' work/logs work/stress \
      work/flow_result.json gpu-smoke-work/logs gpu-smoke-work/real-model/runs runs llama3-stack/runs llama3-stack/*.log release-time-stack/runs release-time-stack/*.log shape schemes shapes/boots peak/boots moe/runs \
      2>/dev/null) || true
  (tar -czf "$DEST/runs.tar.gz" --exclude='*.safetensors' runs 2>/dev/null) || true  # make demo's runs
  echo "collected into $DEST: $(ls "$DEST" | tr '\n' ' ')"
  ;;
*)
  sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2
  ;;
esac
