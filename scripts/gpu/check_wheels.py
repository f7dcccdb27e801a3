"""Check a wheel set against what the GPU host already has, before sending it.

    python scripts/gpu/check_wheels.py HOST_FREEZE.txt .gpu-wheels/pipeline [--extra lm-eval=api]

HOST_FREEZE.txt is `python3 -m pip list --format=freeze` as run on the host. Every requirement
of every wheel in the folder (markers evaluated for Python 3.12 on Linux x86_64; extras only
where named) must be met by a wheel of the set or by the host's own package; the script prints
each unmet one (missing, or the host's version outside the range) and exits 1 if there is any.
Packages the set carries shadow the host's (the set's folder comes first on PYTHONPATH).
"""

from __future__ import annotations

import re
import sys
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.version import Version


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_meta(path: Path) -> tuple[str, str, list[str]]:
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    name = re.search(r"^Name: (.+)$", text, re.M).group(1).strip()
    version = re.search(r"^Version: (.+)$", text, re.M).group(1).strip()
    return name, version, re.findall(r"^Requires-Dist: (.+)$", text, re.M)


def main(argv: list[str]) -> int:
    freeze_file, folder, *rest = argv
    extras: dict[str, set[str]] = {}
    for i, arg in enumerate(rest):
        if arg == "--extra":
            pkg, ex = rest[i + 1].split("=")
            extras.setdefault(norm(pkg), set()).add(ex)
    host = {}
    for line in Path(freeze_file).read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            n, v = line.split("==", 1)
            host[norm(n)] = v.strip()
    wheels = {}
    for whl in sorted(Path(folder).glob("*.whl")):
        name, version, reqs = wheel_meta(whl)
        wheels[norm(name)] = (version, reqs)
    env = default_environment()
    env.update(python_version="3.12", python_full_version="3.12.3", sys_platform="linux",
               platform_system="Linux", platform_machine="x86_64", implementation_name="cpython",
               platform_python_implementation="CPython", os_name="posix")
    unmet = []
    for pkg, (version, reqs) in wheels.items():
        for raw in reqs:
            try:
                req = Requirement(raw.strip())
            except ValueError:
                print(f"unparsed requirement of {pkg}: {raw.strip()!r}")
                continue
            wanted = extras.get(pkg, set()) | {""}
            if req.marker and not any(req.marker.evaluate({**env, "extra": e}) for e in wanted):
                continue
            dep = norm(req.name)
            have = wheels[dep][0] if dep in wheels else host.get(dep)
            where = "set" if dep in wheels else "host"
            if have is None:
                unmet.append(f"{pkg} {version} needs {raw}: missing")
            elif req.specifier and not req.specifier.contains(Version(have), prereleases=True):
                unmet.append(f"{pkg} {version} needs {raw}: {where} has {have}")
    shadowed = sorted(set(wheels) & set(host))
    print(f"{len(wheels)} wheels; {len(shadowed)} shadow a host package: {', '.join(shadowed) or '-'}")
    for line in unmet:
        print("UNMET", line)
    return 1 if unmet else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
