#!/usr/bin/env bash
# On the target host: join the wheelhouse pieces made by scripts/gpu/prepare_wheels.sh, verify them,
# and unpack the flat wheelhouse that `QS_WHEELHOUSE=DEST make setup` installs from.
#
#   scripts/gpu/receive_wheels.sh PARTS_DIR DEST
#
# PARTS_DIR holds every wheelhouse.tar.part-NN and SHA256SUMS (the files of all send/NN folders,
# gathered in any order). Each part and the joined tar are checked against SHA256SUMS before anything
# is unpacked; a missing or damaged part is named. About 10 s for 1.3 GB.
set -euo pipefail
parts=${1:?usage: receive_wheels.sh PARTS_DIR DEST}
dest=${2:?usage: receive_wheels.sh PARTS_DIR DEST}
mkdir -p "$dest" && dest=$(cd "$dest" && pwd)
cd "$parts"
[ -f SHA256SUMS ] || { echo "receive_wheels: no SHA256SUMS in $parts" >&2; exit 1; }

missing=$(grep -o 'wheelhouse\.tar\.part-[0-9]*' SHA256SUMS | while read -r p; do [ -f "$p" ] || echo "$p"; done)
[ -z "$missing" ] || { echo "receive_wheels: missing in $parts:" $missing >&2; exit 1; }
grep 'wheelhouse\.tar\.part-' SHA256SUMS | sha256sum -c --quiet ||
  { echo "receive_wheels: a part is damaged (above): send it again" >&2; exit 1; }
want=$(awk '$2 == "wheelhouse.tar" {print $1}' SHA256SUMS)
have=$(cat wheelhouse.tar.part-* | sha256sum | cut -d' ' -f1)
[ "$have" = "$want" ] || { echo "receive_wheels: the joined tar does not match SHA256SUMS" >&2; exit 1; }

cat wheelhouse.tar.part-* | tar -xf - -C "$dest" --strip-components=1
echo "receive_wheels: $(ls "$dest"/*.whl | wc -l) wheels, $(du -sh "$dest" | cut -f1) in $dest"
echo "next: QS_WHEELHOUSE=$dest make setup"
