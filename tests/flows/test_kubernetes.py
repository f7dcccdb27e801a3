"""The llama3-k8s deployment: its work pool's job template, rendered by prefect-kubernetes' own code,
and the pod image (Dockerfile) it runs. No cluster and no Docker here: these check the manifest the
Kubernetes worker would submit and the facts the image and the deployment must agree on.

The rendering is the worker's: `KubernetesWorkerJobConfiguration.from_template_and_values` (the pool's
base job template + the deployment's job variables, then a flow run's) and `prepare_for_flow_run`.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import shlex
import uuid

import pytest
import yaml

from tests.conftest import ROOT

TEMPLATE_PATH = ROOT / "deploy" / "k8s" / "gpu-k8s-job-template.json"
DEPLOYMENTS = {d["name"]: d for d in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]}
K8S = DEPLOYMENTS["llama3-k8s"]
JOB_VARIABLES = K8S["work_pool"]["job_variables"]
WORKER_TOKEN = "hf_worker_side_token_must_not_reach_the_pod_0123"
WORK_MOUNT = "/var/lib/quantize-serve"  # the work volume's mount (the template's)


def load_template() -> dict:
    return json.loads(TEMPLATE_PATH.read_text())


def recipe():
    from quantize_serve.recipe.load import load_recipe

    return load_recipe(ROOT / K8S["parameters"]["recipe"])


def render(flow_run_job_variables: dict | None = None) -> dict:
    """The Job manifest the Kubernetes worker would create for a run of llama3-k8s."""
    from prefect.client.schemas.objects import Flow, FlowRun
    from prefect.client.schemas.responses import DeploymentResponse
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

    flow = Flow(id=uuid.uuid4(), name="quantize-serve")
    deployment = DeploymentResponse(
        id=uuid.uuid4(), name=K8S["name"], flow_id=flow.id, job_variables=copy.deepcopy(JOB_VARIABLES)
    )
    flow_run = FlowRun(
        id=uuid.uuid4(),
        name="k8s-render",
        flow_id=flow.id,
        deployment_id=deployment.id,
        job_variables=flow_run_job_variables or {},
    )
    # the worker's merge (BaseJobConfiguration.resolve_for_flow_run): deployment's, then the run's
    values = copy.deepcopy(deployment.job_variables)
    values.update(flow_run.job_variables)
    config = asyncio.run(KubernetesWorkerJobConfiguration.from_template_and_values(load_template(), values))
    config.prepare_for_flow_run(flow_run=flow_run, deployment=deployment, flow=flow)
    return config.job_manifest


def container(manifest: dict) -> dict:
    (only,) = manifest["spec"]["template"]["spec"]["containers"]
    return only


def dockerfile() -> dict[str, list[str]]:
    """Instruction -> its arguments, one entry per occurrence (continuation lines joined)."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, rest = line.partition(" ")
            out.setdefault(instruction.upper(), []).append(rest.strip())
    return out


def dockerfile_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for args in dockerfile()["ENV"]:
        env.update(part.split("=", 1) for part in shlex.split(args))
    return env


def test_template_is_the_library_default_plus_the_gpu_additions():
    """Made from prefect-kubernetes' default (get_default_base_job_template): take our additions out
    and the default is left, unchanged. Fails when a prefect-kubernetes upgrade changes its default:
    regenerate the template from the new default then."""
    from prefect_kubernetes.worker import KubernetesWorker

    default = KubernetesWorker.get_default_base_job_template()
    ours = load_template()
    added = {
        "gpu_count",
        "node_selector",
        "tolerations",
        "shm_size",
        "hf_token_secret_name",
        "hf_token_secret_key",
        "work_volume",
    }
    properties = ours["variables"]["properties"]
    assert set(properties) == set(default["variables"]["properties"]) | added
    for name, schema in default["variables"]["properties"].items():
        assert properties[name] == schema, name
    assert ours["variables"]["definitions"] == default["variables"]["definitions"]

    config = copy.deepcopy(ours["job_configuration"])
    pod = config["job_manifest"]["spec"]["template"]["spec"]
    assert pod.pop("nodeSelector") == "{{ node_selector }}"
    assert pod.pop("tolerations") == "{{ tolerations }}"
    assert pod.pop("volumes") == [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "{{ shm_size }}"}},
        "{{ work_volume }}",
    ]
    main = pod["containers"][0]
    assert main.pop("volumeMounts") == [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "work", "mountPath": WORK_MOUNT},
    ]
    assert main["resources"]["limits"].pop("nvidia.com/gpu") == "{{ gpu_count }}"
    assert main["env"] == [
        {
            "name": "HF_TOKEN",
            "valueFrom": {
                "secretKeyRef": {"name": "{{ hf_token_secret_name }}", "key": "{{ hf_token_secret_key }}"}
            },
        }
    ]
    main["env"] = "{{ env }}"
    assert config == default["job_configuration"]


def test_deployment_is_llama3_on_the_kubernetes_pool_with_one_gpu_per_tensor_parallel_rank():
    llama3 = DEPLOYMENTS["llama3"]
    assert (K8S["entrypoint"], K8S["parameters"]) == (llama3["entrypoint"], llama3["parameters"])
    assert K8S["work_pool"]["name"] == "gpu-k8s"
    assert JOB_VARIABLES["gpu_count"] == recipe().serve.tensor_parallel_size


def test_rendered_job_requests_the_gpus_on_a_gpu_node_with_shared_memory():
    manifest = render()
    pod, main = manifest["spec"]["template"]["spec"], container(manifest)
    assert main["resources"]["limits"] == {"nvidia.com/gpu": recipe().serve.tensor_parallel_size}
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    shm, work = pod["volumes"]
    assert shm["emptyDir"]["medium"] == "Memory"
    assert work == {"name": "work", "emptyDir": {}}  # the pod's own unless the run names a claim
    assert main["volumeMounts"] == [
        {"name": shm["name"], "mountPath": "/dev/shm"},
        {"name": work["name"], "mountPath": WORK_MOUNT},
    ]
    assert main["image"] == JOB_VARIABLES["image"]
    assert manifest["kind"] == "Job" and pod["restartPolicy"] == "Never"


def test_with_a_volume_claim_the_work_dir_outlives_the_pod_so_the_next_run_knows_its_base():
    """The work dir holds the base's download, its reference figures (a known base is not served again),
    the checkpoints and vLLM's compile cache; the runs' folders and the datasets' cache go there too."""
    claim = {"name": "work", "persistentVolumeClaim": {"claimName": "quantize-serve-work"}}
    manifest = render({"work_volume": claim})
    pod, main = manifest["spec"]["template"]["spec"], container(manifest)
    assert claim in pod["volumes"]
    assert {"name": "work", "mountPath": WORK_MOUNT} in main["volumeMounts"]
    env = {e["name"]: e.get("value") for e in main["env"]}
    for name in ("QS_WORK_DIR", "QS_RUNS_DIR", "HF_HOME"):
        assert env[name].startswith(WORK_MOUNT + "/"), name
    assert len({env["QS_WORK_DIR"], env["QS_RUNS_DIR"], env["HF_HOME"]}) == 3


def test_a_run_with_tensor_parallel_two_gets_two_gpus_on_the_nodes_it_names():
    manifest = render({"gpu_count": 2, "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H200"}})
    assert container(manifest)["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert manifest["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}


def test_hf_token_comes_only_from_the_kubernetes_secret(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", WORKER_TOKEN)  # the worker's own token stays with the worker
    manifest = render()
    env = container(manifest)["env"]
    token_env = recipe().hub.token_env
    tokens = [e for e in env if e["name"] == token_env]
    assert tokens == [
        {
            "name": token_env,
            "valueFrom": {"secretKeyRef": {"name": JOB_VARIABLES["hf_token_secret_name"], "key": "token"}},
        }
    ]
    assert not [e for e in env if "TOKEN" in e["name"].upper() and "value" in e]
    assert WORKER_TOKEN not in json.dumps(manifest)
    assert not [k for k in JOB_VARIABLES.get("env", {}) if "TOKEN" in k.upper()]


def test_rendered_command_is_prefects_and_runs_in_the_pipeline_environment_of_the_image():
    manifest = render()
    main = container(manifest)
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert main["args"] == ["prefect", "flow-run", "execute"]
    assert "command" not in main  # so the image's ENTRYPOINT runs it: the Dockerfile clears vLLM's
    assert dockerfile()["ENTRYPOINT"] == ["[]"]
    project = dockerfile_env()["QS_PROJECT_DIR"]
    assert dockerfile_env()["PATH"].split(":")[0] == f"{project}/.venv/bin"  # where `prefect` is found
    assert env["QS_SERVING_PYTHON"] == dockerfile_env()["QS_SERVING_PYTHON"]
    assert env["QS_PROJECT_DIR"] == project


def test_dockerfile_is_the_gpu_vllm_image_plus_the_pipeline_environment_at_the_deployments_path():
    from scripts.check_pins import problems

    assert problems(ROOT) == []  # the vLLM pin, its torch and the Dockerfile agree
    facts, env = dockerfile(), dockerfile_env()
    assert facts["FROM"] == ["vllm/vllm-openai:v${VLLM_VERSION}"]
    assert env["QS_SERVING_PYTHON"] == JOB_VARIABLES["env"]["QS_SERVING_PYTHON"] == "/usr/bin/python3"
    project = env["QS_PROJECT_DIR"]
    assert facts["WORKDIR"] == [project]
    assert JOB_VARIABLES["env"]["QS_PROJECT_DIR"] == project
    (pull,) = K8S["pull"]
    assert pull["prefect.deployments.steps.set_working_directory"]["directory"] == project
    # the pipeline venv is built by set-up from the project's requirement files, not a second list of pins
    runs = " ".join(facts["RUN"])
    assert "scripts/check_pins.py" in runs and "QS_DEVICE=cuda" in runs and "scripts/setup.sh" in runs
    assert not re.search(r"\b[\w.-]+==\d", runs), "pins belong in requirements/"


@pytest.mark.parametrize("entry", [".venv", ".venv-serve", ".git", ".cache", "runs"])
def test_dockerignore_keeps_local_environments_and_outputs_out_of_the_image(entry):
    assert entry in (ROOT / ".dockerignore").read_text().split()
