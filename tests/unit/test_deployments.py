"""The deployments of prefect.yaml load the way a worker loads them on a plain checkout.

A worker imports a deployment's entrypoint as a script module named after the file. A flow file
named like the project's package (flows/quantize_serve.py) took the package's place in
sys.modules, and `from quantize_serve.capacity.measure import ...` then failed on every host where the
project is not pip-installed in editable mode (a GPU image with the checkout on PYTHONPATH). The
editable install's import hook hid that here, so this test loads each entrypoint without it:
`python -S` (no site processing, so no editable finder) with the environment's packages and the
checkout on PYTHONPATH, as scripts/gpu/host.sh runs it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT

DEPLOYMENTS = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]
LOAD = (
    "import sys\n"  # what the worker's flow-run process does (load_flow_from_entrypoint -> import_object)
    "from prefect.utilities.importtools import import_object\n"
    "flow = import_object(sys.argv[1])\n"
    "print(flow.name)\n"
)


@pytest.mark.parametrize("entrypoint", sorted({d["entrypoint"] for d in DEPLOYMENTS}))
def test_entrypoint_loads_without_an_editable_install(entrypoint: str):
    # this interpreter's package folders (a GPU host's reused torch folder too), without the editable
    # install's finder, which -S leaves out
    site_packages = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    done = subprocess.run(
        [sys.executable, "-S", "-c", LOAD, entrypoint],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PYTHONPATH": ":".join([*site_packages, str(ROOT)]),
            "PREFECT_HOME": str(ROOT / ".cache" / "prefect-load-test"),
        },
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "quantize-serve"
