#!/usr/bin/env bash
# Installs the bench's serving peers (FlashInfer, its tvm_ffi, FlashAttention-3) on the GPU
# machine from wheels carried in a git-ignored folder of the repository, and exports what
# they need. Source it (the exports must reach the caller):
#
#   source tools/gpu/install_peers.sh [WHEEL_DIR]      # default .peers
#
# The machine has no network: pip installs the carried wheels only (--no-index --no-deps),
# into /tmp/site (the system site-packages is left alone); PYTHONPATH gains /tmp/site, and
# FLASHINFER_WORKSPACE_BASE points FlashInfer's cache at a writable /tmp/fiws. Where the wheels
# come from and which a run needs: tools/gpu/README.md ("Serving peers").
#
# WHEEL_DIR may instead be a .tar.xz from tools/gpu/pack_peers.sh (the wheels unzipped and
# xz-compressed: FlashInfer's 31 MB of wheels in 16 MB, so they fit a call's 64 MiB carry
# beside a package); its wheels are zipped again here (pip checks each file against the
# wheel's RECORD, not the archive's bytes).
peers_dir="${1:-${SPLITKV_PEERS_DIR:-.peers}}"
site="${SPLITKV_PEERS_SITE:-/tmp/site}"
if [[ -f "${peers_dir}" && "${peers_dir}" == *.tar.xz ]]; then
  unpacked="$(mktemp -d /tmp/peers.XXXXXX)"
  tar xJf "${peers_dir}" -C "${unpacked}"
  for tree in "${unpacked}"/*.whl.d; do
    (cd "${tree}" && python3 -m zipfile -c "${unpacked}/$(basename "${tree}" .d)" $(ls -A))
  done
  peers_dir="${unpacked}"
fi
shopt -s nullglob
wheels=("${peers_dir}"/*.whl)
shopt -u nullglob
if [[ ${#wheels[@]} -eq 0 ]]; then
  echo "install_peers: no wheels in ${peers_dir}: the bench reports the peers as skipped" >&2
  return 0 2>/dev/null || exit 0
fi
if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "${site}" "${wheels[@]}"; then
  export PYTHONPATH="${site}${PYTHONPATH:+:${PYTHONPATH}}"
  export FLASHINFER_WORKSPACE_BASE="${FLASHINFER_WORKSPACE_BASE:-/tmp/fiws}"
  mkdir -p "${FLASHINFER_WORKSPACE_BASE}"
  echo "install_peers: installed $(printf '%s ' "${wheels[@]##*/}")into ${site}"
else
  echo "install_peers: pip install of ${wheels[*]} failed: the bench reports the peers as skipped" >&2
fi
