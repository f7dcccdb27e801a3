"""The vLLM version for GPU hosts is named in one place; check what follows it.

    python scripts/check_pins.py [--vllm VERSION] [--wheelhouse DIR]

- requirements/serving-cuda.txt pins ``vllm==V``: the one place.
- requirements/torch-cuda.txt pins the torch that vLLM V pins (vLLM's own wheel metadata when a
  wheelhouse holding it is given, else the table below of what each vLLM release pins).
- The Dockerfile builds ``FROM vllm/vllm-openai:v${VLLM_VERSION}`` with ``ARG VLLM_VERSION=V``, and its
  build runs this script with ``--vllm "$VLLM_VERSION"`` so that a ``--build-arg`` of another version fails.

Exit 0 when everything agrees, 1 with one line per disagreement. ``problems()`` is the same check for tests.
"""

from __future__ import annotations

import argparse
import re
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# torch that a vLLM release pins (its wheel's Requires-Dist), for checking without the wheel at hand.
VLLM_TORCH = {"0.26.0": "2.11.0"}


@dataclass(frozen=True)
class Pins:
    vllm: str | None
    torch_cuda: str | None
    docker_arg: str | None
    docker_from: str | None


def _pin(path: Path, name: str) -> str | None:
    found = re.findall(rf"^{re.escape(name)}==(\S+)\s*$", path.read_text(), re.M) if path.is_file() else []
    return found[0] if len(found) == 1 else None


def read_pins(root: Path = ROOT) -> Pins:
    docker = (root / "Dockerfile").read_text() if (root / "Dockerfile").is_file() else ""
    arg = re.search(r"^ARG VLLM_VERSION=(\S+)\s*$", docker, re.M)
    frm = re.search(r"^FROM (\S+)", docker, re.M)
    return Pins(
        vllm=_pin(root / "requirements/serving-cuda.txt", "vllm"),
        torch_cuda=_pin(root / "requirements/torch-cuda.txt", "torch"),
        docker_arg=arg.group(1) if arg else None,
        docker_from=frm.group(1) if frm else None,
    )


def torch_pinned_by_vllm(version: str, wheelhouse: Path | None = None) -> str | None:
    """The torch version vLLM `version` requires exactly: from its wheel if one is in `wheelhouse`."""
    for whl in sorted(wheelhouse.glob(f"vllm-{version}-*.whl")) if wheelhouse else []:
        with zipfile.ZipFile(whl) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            found = re.search(r"^Requires-Dist: torch\s*==\s*([^\s;,]+)", z.read(meta).decode(), re.M)
        return found.group(1) if found else None
    return VLLM_TORCH.get(version)


def problems(root: Path = ROOT, *, vllm_arg: str | None = None, wheelhouse: Path | None = None) -> list[str]:
    p = read_pins(root)
    out = []
    if not p.vllm:
        return ["requirements/serving-cuda.txt: expected exactly one line vllm==VERSION"]
    if not p.torch_cuda:
        out.append("requirements/torch-cuda.txt: expected exactly one line torch==VERSION")
    wanted_torch = torch_pinned_by_vllm(p.vllm, wheelhouse)
    if wanted_torch is None:
        out.append(
            f"vllm=={p.vllm}: its torch pin is unknown here: pass --wheelhouse with its wheel, "
            f"or add it to VLLM_TORCH in scripts/check_pins.py"
        )
    elif p.torch_cuda and p.torch_cuda != wanted_torch:
        out.append(
            f"requirements/torch-cuda.txt pins torch=={p.torch_cuda}, vllm=={p.vllm} pins "
            f"torch=={wanted_torch}"
        )
    if p.docker_arg != p.vllm:
        out.append(
            f"Dockerfile: ARG VLLM_VERSION={p.docker_arg}, requirements/serving-cuda.txt: vllm=={p.vllm}"
        )
    if p.docker_from != "vllm/vllm-openai:v${VLLM_VERSION}":
        out.append(f"Dockerfile: FROM {p.docker_from}, expected vllm/vllm-openai:v${{VLLM_VERSION}}")
    if vllm_arg is not None and vllm_arg != p.vllm:
        out.append(f"VLLM_VERSION={vllm_arg} (build argument), requirements/serving-cuda.txt: vllm=={p.vllm}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm", help="the VLLM_VERSION an image is being built with")
    ap.add_argument("--wheelhouse", type=Path, help="a folder holding the vllm wheel (its torch pin)")
    args = ap.parse_args(argv)
    found = problems(vllm_arg=args.vllm, wheelhouse=args.wheelhouse)
    for line in found:
        print(f"check_pins: {line}", file=sys.stderr)
    if not found:
        p = read_pins()
        print(
            f"check_pins: vllm=={p.vllm} (requirements/serving-cuda.txt), torch=={p.torch_cuda}, "
            f"Dockerfile vllm/vllm-openai:v{p.docker_arg}: they agree"
        )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
