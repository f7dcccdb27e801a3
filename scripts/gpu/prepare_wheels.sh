#!/usr/bin/env bash
# Download the two wheel sets a GPU host without a registry needs, for its Python 3.12 (x86_64,
# manylinux), then tar each set and split it into chunks small enough to send one at a time.
#
#   serving  (scripts/gpu/serving-wheels.txt):  vLLM 0.26.0 and what the host image lacks for it.
#   pipeline (scripts/gpu/pipeline-wheels.txt): llm-compressor 0.14.0.1, prefect 3.9.1,
#            lm-eval[api] 0.4.13, pydantic-settings and what the image lacks for them.
# The two sets pin different compressed-tensors (0.17.0 for vLLM, 0.19.0 for llm-compressor), so
# they are installed into separate --target folders on the host (see scripts/gpu/README.md).
#
# Output (git-ignored through .git/info/exclude):
#   .gpu-wheels/serving/*.whl, .gpu-wheels/pipeline/*.whl
#   .gpu-wheels/send/s0 .. sN/   one chunk of serving.tar each
#   .gpu-wheels/send/p0/         pipeline.tar chunk(s) and SHA256SUMS of both tars
# Environment: CHUNK_MIB (default 56: a chunk plus the working tree stays under 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/../.."
WHEELS=.gpu-wheels
CHUNK_MIB=${CHUNK_MIB:-56}
PY=${PYTHON:-python3}
# pure-Python packages published as source only: built here into wheels (they are platform-free)
SDIST_ONLY='^(sqlitedict|rouge_score|rouge-score|word2number)=='

mkdir -p .git/info "$WHEELS/serving" "$WHEELS/pipeline" "$WHEELS/build"
grep -qx '/.gpu-wheels/' .git/info/exclude 2>/dev/null || echo '/.gpu-wheels/' >> .git/info/exclude

PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp)
for tag in manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 \
           manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1; do
  PLATFORM+=(--platform "${tag}_x86_64")
done

echo "== serving wheels"
"$PY" -m pip download -q --no-deps "${PLATFORM[@]}" -d "$WHEELS/serving" -r scripts/gpu/serving-wheels.txt
echo "== pipeline wheels"
grep -v -i -E "$SDIST_ONLY" scripts/gpu/pipeline-wheels.txt > "$WHEELS/build/binary.txt"
grep -i -E "$SDIST_ONLY" scripts/gpu/pipeline-wheels.txt > "$WHEELS/build/sdist.txt" || true
"$PY" -m pip download -q --no-deps "${PLATFORM[@]}" -d "$WHEELS/pipeline" -r "$WHEELS/build/binary.txt"
if [ -s "$WHEELS/build/sdist.txt" ]; then
  "$PY" -m pip wheel -q --no-deps -w "$WHEELS/pipeline" -r "$WHEELS/build/sdist.txt"
fi

# pip may save one release twice (two manylinux tags): keep one wheel per package and stop on two
# versions of one package (either stops the whole install on the host).
one_wheel_per_package() {
  "$PY" - "$1" <<'PYEOF'
import re, sys
from pathlib import Path
seen = {}
for whl in sorted(Path(sys.argv[1]).glob("*.whl")):
    name, version = whl.name.split("-")[:2]
    key = re.sub(r"[-_.]+", "-", name).lower()
    if key in seen:
        if seen[key] != version:
            sys.exit(f"two versions of {key} in {sys.argv[1]}: {seen[key]} and {version}; remove the stale one")
        whl.unlink()
        print(f"   dropped duplicate {whl.name}")
    else:
        seen[key] = version
PYEOF
}
one_wheel_per_package "$WHEELS/serving"
one_wheel_per_package "$WHEELS/pipeline"

echo "== tar and split into ${CHUNK_MIB} MiB chunks"
rm -rf "$WHEELS/send" && mkdir -p "$WHEELS/send/p0"
tar -cf "$WHEELS/build/serving.tar" -C "$WHEELS" serving
tar -cf "$WHEELS/build/pipeline.tar" -C "$WHEELS" pipeline
(cd "$WHEELS/build" && sha256sum serving.tar pipeline.tar > ../send/p0/SHA256SUMS)
split -b "${CHUNK_MIB}m" -d -a 2 "$WHEELS/build/serving.tar" "$WHEELS/build/serving.tar.part-"
i=0
for part in "$WHEELS"/build/serving.tar.part-*; do
  mkdir -p "$WHEELS/send/s$i" && mv "$part" "$WHEELS/send/s$i/"
  i=$((i + 1))
done
split -b "${CHUNK_MIB}m" -d -a 2 "$WHEELS/build/pipeline.tar" "$WHEELS/send/p0/pipeline.tar.part-"
if [ "$(ls "$WHEELS/send/p0" | grep -c part-)" -gt 1 ]; then
  echo "pipeline.tar is larger than one chunk: send the extra parts in their own folders" >&2
fi
rm -f "$WHEELS/build/serving.tar" "$WHEELS/build/pipeline.tar"
echo "== ready: $(ls "$WHEELS/serving" | wc -l) serving wheels, $(ls "$WHEELS/pipeline" | wc -l) pipeline wheels"
du -sh "$WHEELS"/send/* | sed 's/^/   /'
