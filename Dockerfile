# The pod image of the llama3-k8s deployment (prefect.yaml): both environments in one image.
#   serving   vLLM's official image, unchanged: its own Python (vLLM installed there) is QS_SERVING_PYTHON.
#   pipeline  a venv at /opt/quantize-serve/.venv built by scripts/setup.sh as `make setup` builds it on a
#             GPU host (requirements/pipeline.txt + requirements/torch-cuda.txt), reusing the image's CUDA
#             torch rather than a second copy, with the project installed in it; Prefect's worker starts
#             `prefect flow-run execute` from it.
# VLLM_VERSION is the vLLM that requirements/serving-cuda.txt pins; scripts/check_pins.py fails the build
# when they differ (also for a --build-arg VLLM_VERSION=...).
# Build from the repository root:  docker build -t REGISTRY/quantize-serve:0.1.0 .
ARG VLLM_VERSION=0.26.0
FROM vllm/vllm-openai:v${VLLM_VERSION}
ARG VLLM_VERSION

ENV QS_SERVING_PYTHON=/usr/bin/python3 \
    QS_PROJECT_DIR=/opt/quantize-serve \
    PATH=/opt/quantize-serve/.venv/bin:$PATH \
    PYTHONUNBUFFERED=1
# Fail the build, not a run, if the base image's Python is not the one with this vLLM.
RUN "$QS_SERVING_PYTHON" -c "import sys, vllm; print('serving environment: vLLM', vllm.__version__); sys.exit(vllm.__version__.split('+')[0] != '$VLLM_VERSION')"

WORKDIR /opt/quantize-serve
# The project, editable as `make setup` installs it, so its runs/ and .cache/ resolve under this folder.
# Set-up needs the project's files, so this layer is rebuilt when any of them changes.
COPY . .
RUN python3 scripts/check_pins.py --vllm "$VLLM_VERSION" \
 && PIP_NO_CACHE_DIR=1 QS_DEVICE=cuda PYTHON="$QS_SERVING_PYTHON" scripts/setup.sh \
 && .venv/bin/python -c "import flows.pipeline; print('pipeline environment: flow imports')"

# The vLLM image's entrypoint is `vllm serve`; Prefect's worker gives the pod its command as args.
ENTRYPOINT []
CMD ["prefect", "version"]
