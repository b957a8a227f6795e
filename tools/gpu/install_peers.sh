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
peers_dir="${1:-${SPLITKV_PEERS_DIR:-.peers}}"
site="${SPLITKV_PEERS_SITE:-/tmp/site}"
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
