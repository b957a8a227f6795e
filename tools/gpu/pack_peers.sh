#!/usr/bin/env bash
# Packs a folder of peer wheels (tools/gpu/install_peers.sh) as one .tar.xz of the unzipped
# wheels, for carrying to the GPU machine: xz over the unzipped files is about half the
# wheels' size (FlashInfer 0.7.2 with tvm_ffi: 31 -> 16 MB), which decides whether a package
# and the peers fit one call's 64 MiB carry. install_peers.sh takes the archive in place of
# the folder.
#
#   tools/gpu/pack_peers.sh WHEEL_DIR OUT.tar.xz
set -euo pipefail
if [[ $# -ne 2 ]]; then
  echo "usage: $0 WHEEL_DIR OUT.tar.xz" >&2
  exit 2
fi
wheel_dir="$1"
out="$(realpath -m "$2")"
work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
shopt -s nullglob
wheels=("${wheel_dir}"/*.whl)
if [[ ${#wheels[@]} -eq 0 ]]; then
  echo "pack_peers: no wheels in ${wheel_dir}" >&2
  exit 1
fi
for wheel in "${wheels[@]}"; do
  tree="${work}/$(basename "${wheel}").d"
  mkdir -p "${tree}"
  python3 -m zipfile -e "${wheel}" "${tree}"
done
tar cJf "${out}" -C "${work}" .
echo "pack_peers: ${#wheels[@]} wheels -> ${out} ($(du -h "${out}" | cut -f1))"
