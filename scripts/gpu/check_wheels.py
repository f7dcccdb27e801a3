"""Check a wheelhouse against what the target host already has, before carrying it there.

    python scripts/gpu/check_wheels.py HOST_FREEZE WHEELHOUSE [--python 3.12] [-r REQUIREMENTS ...]
                                       [--extra PACKAGE=EXTRA ...]

HOST_FREEZE is `python3 -m pip list --format=freeze` as run on the host (`/dev/null` for a bare
host). Every requirement of every wheel in the folder, and of every requirement file given with -r,
must be met by a wheel of the folder or by the host's own package (environment markers evaluated
for that Python on Linux x86_64; a wheel's extras where anything asks for them, or where named with
--extra). A folder may hold several versions of one package (the pipeline and serving environments
pin different compressed-tensors): a requirement is met when one of them fits. Prints each unmet
requirement (missing, or no version in range) and exits 1 if there is any.
scripts/gpu/prepare_wheels.sh runs it; pip's own dry run there is the exact per-environment check.
"""

from __future__ import annotations

import argparse
import re
import sys
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version


def wheel_meta(path: Path) -> tuple[str, str, list[str]]:
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    name = re.search(r"^Name: (.+)$", text, re.M).group(1).strip()
    version = re.search(r"^Version: (.+)$", text, re.M).group(1).strip()
    return name, version, re.findall(r"^Requires-Dist: (.+)$", text, re.M)


def read_freeze(path: Path) -> dict[str, str]:
    host = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            host[canonicalize_name(name)] = version.strip()
    return host


def read_requirements(path: Path) -> list[str]:
    """Requirement lines of a pip requirements file, following -r includes."""
    out = []
    for line in path.read_text().splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(("-r ", "--requirement ")):
            out += read_requirements(path.parent / line.split(None, 1)[1])
        elif not line.startswith("-"):
            out.append(line)
    return out


def marker_env(python: str) -> dict[str, str]:
    env = default_environment()
    env.update(
        python_version=python,
        python_full_version=f"{python}.0",
        sys_platform="linux",
        platform_system="Linux",
        platform_machine="x86_64",
        implementation_name="cpython",
        platform_python_implementation="CPython",
        os_name="posix",
    )
    return env


def fits(req: Requirement, version: str) -> bool:
    try:
        return not req.specifier or req.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def check(
    host: dict[str, str], folder: Path, python: str, roots: list[str], extras: dict[str, set[str]]
) -> tuple[list[str], str]:
    """(unmet requirements, summary line)."""
    wheels: dict[str, list[tuple[str, list[Requirement]]]] = {}
    unparsed = []
    for whl in sorted(folder.glob("*.whl")):
        name, version, raw = wheel_meta(whl)
        reqs = []
        for r in raw:
            try:
                reqs.append(Requirement(r.strip()))
            except InvalidRequirement:
                unparsed.append(f"{name} {version}: {r.strip()!r}")
        wheels.setdefault(canonicalize_name(name), []).append((version, reqs))
    env = marker_env(python)
    root_reqs = [Requirement(r) for r in roots]

    def active(req: Requirement, pkg_extras: set[str]) -> bool:
        return not req.marker or any(req.marker.evaluate({**env, "extra": e}) for e in pkg_extras | {""})

    # extras anything asks for, to a fixed point (lm-eval[api], fastapi[standard], ...)
    wanted = {k: set(v) for k, v in extras.items()}
    for req in root_reqs:
        wanted.setdefault(canonicalize_name(req.name), set()).update(req.extras)
    changed = True
    while changed:
        changed = False
        for pkg, versions in wheels.items():
            for _, reqs in versions:
                for req in reqs:
                    dep = canonicalize_name(req.name)
                    if (
                        req.extras
                        and active(req, wanted.get(pkg, set()))
                        and not req.extras <= wanted.get(dep, set())
                    ):
                        wanted.setdefault(dep, set()).update(req.extras)
                        changed = True

    unmet = [f"unparsed requirement of {u}" for u in unparsed]

    def need(who: str, req: Requirement) -> None:
        dep = canonicalize_name(req.name)
        have = [v for v, _ in wheels.get(dep, [])] + ([host[dep]] if dep in host else [])
        if not have:
            unmet.append(f"{who} needs {req}: missing")
        elif not any(fits(req, v) for v in have):
            unmet.append(f"{who} needs {req}: only {', '.join(have)}")

    for req in root_reqs:
        if active(req, set()):
            need("requirements", req)
    for pkg, versions in wheels.items():
        for version, reqs in versions:
            for req in reqs:
                if active(req, wanted.get(pkg, set())):
                    need(f"{pkg} {version}", req)
    files = sum(len(v) for v in wheels.values())
    multi = [f"{p} {'/'.join(v for v, _ in vs)}" for p, vs in sorted(wheels.items()) if len(vs) > 1]
    shadowed = sorted(set(wheels) & set(host))
    summary = (
        f"{files} wheels of {len(wheels)} packages; several versions: {', '.join(multi) or '-'}; "
        f"{len(shadowed)} also on the host: {', '.join(shadowed) or '-'}"
    )
    return unmet, summary


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("host_freeze", type=Path)
    ap.add_argument("wheelhouse", type=Path)
    ap.add_argument("--python", default="3.12", help="the host's Python, major.minor")
    ap.add_argument("-r", dest="requirements", action="append", type=Path, default=[])
    ap.add_argument("--extra", action="append", default=[], help="PACKAGE=EXTRA, e.g. lm-eval=api")
    args = ap.parse_args(argv)
    extras: dict[str, set[str]] = {}
    for item in args.extra:
        pkg, extra = item.split("=", 1)
        extras.setdefault(canonicalize_name(pkg), set()).add(extra)
    roots = [r for f in args.requirements for r in read_requirements(f)]
    unmet, summary = check(read_freeze(args.host_freeze), args.wheelhouse, args.python, roots, extras)
    print(summary)
    for line in unmet:
        print("UNMET", line)
    return 1 if unmet else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
