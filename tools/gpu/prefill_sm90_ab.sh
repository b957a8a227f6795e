#!/usr/bin/env bash
# Same-run A/B of staged builds of the Hopper prefill: the probe's causal TFLOP/s for each
# package folder given (default: the staged one and any head/ or var/ beside it).
#   run(command="SPLITKV_DEVICE_DIR=.device_prefill bash tools/gpu/prefill_sm90_ab.sh",
#       carry=[".device_prefill"])
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "${root}"
device_dir="${SPLITKV_DEVICE_DIR:-.device}"
dirs=("$@")
[[ ${#dirs[@]} -eq 0 ]] && for d in "${device_dir}/head" "${device_dir}" "${device_dir}/var"; do
  [[ -d "${d}/splitkv" ]] && dirs+=("${d}")
done
for round in 1 2; do
  for d in "${dirs[@]}"; do
    echo "==== ${d} (round ${round})"
    PYTHONPATH="${root}/${d}:${root}/${device_dir}:${root}/tests/python" PROBE_BENCH_ONLY=1 \
      timeout 60 python3 tools/gpu/prefill_sm90_probe.py 2>&1 | grep -E "disable_sm90=0|Error|error"
  done
done
