# The pod image of the llama3-k8s deployment (prefect.yaml): both environments in one image.
#   serving   vLLM's official image, unchanged: its own Python (vLLM installed there) is QS_SERVING_PYTHON.
#   pipeline  a venv at /opt/quantize-serve/.venv from requirements/pipeline.txt (as `make setup` builds
#             .venv), with the project installed in it; Prefect's worker starts `prefect flow-run execute`
#             from it.
# The vLLM version is the one the project runs on GPUs (scripts/gpu/README.md).
# Build from the repository root:  docker build -t REGISTRY/quantize-serve:0.1.0 .
FROM vllm/vllm-openai:v0.26.0

ENV QS_SERVING_PYTHON=/usr/bin/python3 \
    QS_PROJECT_DIR=/opt/quantize-serve \
    PATH=/opt/quantize-serve/.venv/bin:$PATH \
    PYTHONUNBUFFERED=1
# Fail the build, not a run, if the base image's Python is not the one with vLLM.
RUN "$QS_SERVING_PYTHON" -c "import vllm; print('serving environment: vLLM', vllm.__version__)"

WORKDIR /opt/quantize-serve
# The pipeline environment, from the same requirement file as `make setup` (no second list of pins).
# Its torch pin is the CPU build (`torch==X+cpu`); on a GPU image the same version's CUDA build, as
# the file says: drop the +cpu suffix.
COPY requirements/pipeline.txt requirements/pipeline.txt
RUN "$QS_SERVING_PYTHON" -m venv .venv \
 && sed -E 's/^(torch==[^+[:space:]]+)\+cpu/\1/' requirements/pipeline.txt > /tmp/pipeline-gpu.txt \
 && .venv/bin/pip install --no-cache-dir --disable-pip-version-check -r /tmp/pipeline-gpu.txt \
 && rm /tmp/pipeline-gpu.txt

# The project, editable as `make setup` installs it, so its runs/ and .cache/ resolve under this folder.
COPY . .
RUN .venv/bin/pip install --no-cache-dir --disable-pip-version-check --no-deps -e . \
 && .venv/bin/python -c "import flows.pipeline; print('pipeline environment: flow imports')"

# The vLLM image's entrypoint is `vllm serve`; Prefect's worker gives the pod its command as args.
ENTRYPOINT []
CMD ["prefect", "version"]
