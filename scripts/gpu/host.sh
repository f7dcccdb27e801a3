#!/usr/bin/env bash
# Steps run ON the GPU host (see scripts/gpu/README.md). State lives under /tmp, which survives
# between commands while the host is held.
#   bash scripts/gpu/host.sh receive CHUNK_DIR          copy one chunk folder into /tmp/parts
#   bash scripts/gpu/host.sh snapshot                   copy this checkout to /tmp/qs-repo
#   bash scripts/gpu/host.sh build                      start the model build, detached
#   bash scripts/gpu/host.sh install                    join, verify and install both wheel sets
#   bash scripts/gpu/host.sh launch [DRIVER ARGS...]    start benchmarks/h200.py run, detached
#   bash scripts/gpu/host.sh launch-llama3 [ARGS...]    start benchmarks/h200_llama3.py, detached
#   bash scripts/gpu/host.sh launch-shape [ARGS...]     start benchmarks/shape_capacity.py, detached
#   bash scripts/gpu/host.sh launch-schemes [ARGS...]   start benchmarks/h200_schemes.py, detached (no build needed)
#   bash scripts/gpu/host.sh collect SECONDS DEST       wait for the driver, copy results to DEST
set -u
STATE=${QS_GPU_STATE:-/tmp/qs-h200}
REPO=/tmp/qs-repo
PY=$(command -v python3)
mkdir -p "$STATE" /tmp/parts

case "${1:-}" in
receive)
  cp "${2:?chunk folder}"/* /tmp/parts/ && echo "parts: $(ls /tmp/parts | tr '\n' ' ')"
  ;;
snapshot)
  rm -rf "$REPO" && mkdir -p "$REPO" && tar --exclude=./.gpu-wheels --exclude=./.git --exclude=./.venv --exclude=./.venv-serve --exclude=./.cache --exclude=./runs -cf - . | tar -xf - -C "$REPO" && echo "repo copied to $REPO"
  ;;
build)
  cd "$REPO" && setsid nohup "$PY" benchmarks/h200.py build --model-dir "$STATE/model" \
      > "$STATE/build.log" 2>&1 < /dev/null &
  echo $! > "$STATE/build.pid"; echo "build started: pid $(cat "$STATE/build.pid")"
  ;;
install)
  set -e
  cd /tmp/parts
  cat serving.tar.part-* > serving.tar && cat pipeline.tar.part-* > pipeline.tar
  sha256sum -c SHA256SUMS
  rm -rf /tmp/w && mkdir -p /tmp/w && tar -xf serving.tar -C /tmp/w && tar -xf pipeline.tar -C /tmp/w
  rm -f serving.tar pipeline.tar
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-serving /tmp/w/serving/*.whl
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-pipeline /tmp/w/pipeline/*.whl
  printf '#!/bin/sh\nexport PYTHONPATH=/tmp/site-serving\nexec %s "$@"\n' "$PY" > /tmp/serving-python
  chmod +x /tmp/serving-python
  echo "installed: $(ls /tmp/site-serving | grep -c dist-info) serving, $(ls /tmp/site-pipeline | grep -c dist-info) pipeline distributions"
  ;;
launch)
  shift
  cd "$REPO"
  export QS_SERVING_PYTHON=/tmp/serving-python QS_WORK_DIR="$STATE/work" QS_RUNS_DIR="$STATE/runs"
  export PYTHONPATH="/tmp/site-pipeline:$REPO" PYTHONUNBUFFERED=1
  setsid nohup "$PY" benchmarks/h200.py run --model-dir "$STATE/model" --work-dir "$STATE/work" \
      --out "$STATE/h200.json" --build-pid-file "$STATE/build.pid" "$@" \
      > "$STATE/driver.log" 2>&1 < /dev/null &
  echo $! > "$STATE/driver.pid"; echo "driver started: pid $(cat "$STATE/driver.pid")"
  ;;
launch-llama3)
  shift
  cd "$REPO"
  export QS_SERVING_PYTHON=/tmp/serving-python PYTHONPATH="/tmp/site-pipeline:$REPO" PYTHONUNBUFFERED=1
  export PATH="/tmp/site-pipeline/bin:$PATH"  # the `prefect` command of the pipeline set
  setsid nohup "$PY" benchmarks/h200_llama3.py --state "$STATE" --model-dir "$STATE/model" \
      --out "$STATE/h200_llama3.json" --build-pid-file "$STATE/build.pid" "$@" \
      > "$STATE/driver.log" 2>&1 < /dev/null &
  echo $! > "$STATE/driver.pid"; echo "driver started: pid $(cat "$STATE/driver.pid")"
  ;;
launch-shape)
  shift
  cd "$REPO"
  export QS_SERVING_PYTHON=/tmp/serving-python PYTHONPATH="/tmp/site-pipeline:$REPO" PYTHONUNBUFFERED=1
  setsid nohup "$PY" benchmarks/shape_capacity.py --out "$STATE/h200x2_shape.json" --work "$STATE/shape" "$@" \
      > "$STATE/driver.log" 2>&1 < /dev/null &
  echo $! > "$STATE/driver.pid"; echo "driver started: pid $(cat "$STATE/driver.pid")"
  ;;
launch-schemes)
  shift
  cd "$REPO"
  export QS_SERVING_PYTHON=/tmp/serving-python PYTHONPATH="/tmp/site-pipeline:$REPO" PYTHONUNBUFFERED=1
  setsid nohup "$PY" benchmarks/h200_schemes.py --out "$STATE/h200_schemes.json" --work "$STATE/schemes" "$@" \
      > "$STATE/driver.log" 2>&1 < /dev/null &
  echo $! > "$STATE/driver.pid"; echo "driver started: pid $(cat "$STATE/driver.pid")"
  ;;
collect)
  LIMIT=${2:?seconds}; DEST=${3:?destination folder}
  mkdir -p "$DEST"
  t0=$SECONDS
  pid=$(cat "$STATE/driver.pid" 2>/dev/null || echo "")
  while [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && [ $((SECONDS - t0)) -lt "$LIMIT" ]; do sleep 3; done
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then st=running; else st=finished; fi
  for f in h200.json h200_search.json h200_llama3.json h200x2_shape.json h200_schemes.json llama3-watch.log; do [ -f "$STATE/$f" ] && cp "$STATE/$f" "$DEST/$f"; done
  [ -f "$STATE/driver.log" ] && tail -c 4000000 "$STATE/driver.log" > "$DEST/driver.log"
  [ -f "$STATE/build.log" ] && tail -c 100000 "$STATE/build.log" > "$DEST/build.log"
  (cd "$STATE" && tar -czf "$DEST/logs.tar.gz" --exclude='*.safetensors' --exclude='*.parquet' work/logs work/stress \
      work/flow_result.json runs llama3-stack/runs llama3-stack/*.log shape schemes 2>/dev/null) || true
  echo "driver: $st ($((SECONDS - t0)) s waited)"
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader 2>/dev/null || true
  grep -a -E '^\[(h200|shape|schemes)|^[0-9:. ]+\| (INFO|WARNING|ERROR)' "$STATE/driver.log" 2>/dev/null | cut -c1-300 | tail -n 45
  ;;
*)
  echo "usage: $0 receive DIR | snapshot | build | install | launch [ARGS] | collect SECONDS DEST" >&2; exit 2
  ;;
esac
