#!/usr/bin/env bash
# One device run for the Hopper prefill: its pytest file, the probe (errors + before/after
# TFLOP/s at head_dim 128 and 64), then smoke and the three sanitizers (run_checks.sh).
#   run(command="SPLITKV_DEVICE_DIR=.device_prefill bash tools/gpu/prefill_sm90_checks.sh",
#       carry=[".device_prefill"])
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "${root}"
out="${OUT:-/tmp/splitkv_checks}"
mkdir -p "${out}"
device_dir="${SPLITKV_DEVICE_DIR:-.device}"
export PYTHONPATH="${root}/${device_dir}:${root}/tests/python"
export PYTHONUNBUFFERED=1
timeout 100 python3 -m pytest tests/python/prefill_sm90_test.py -q -rs -p no:cacheprovider \
  --timeout 60 --maxfail 20 > "${out}/pytest_prefill_sm90.log" 2>&1
echo "prefill_sm90_test: rc=$? | $(tail -n 1 "${out}/pytest_prefill_sm90.log")"
grep -E "^(FAILED|ERROR)" "${out}/pytest_prefill_sm90.log" | head -n 20
timeout 60 python3 tools/gpu/prefill_sm90_probe.py > "${out}/probe.log" 2>&1
echo "probe: rc=$?"; cat "${out}/probe.log"
timeout "${SANITIZE_TIMEOUT_S:-200}" bash tools/gpu/run_checks.sh smoke sanitize
