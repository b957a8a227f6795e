#!/usr/bin/env bash
# Stop 52: the staged epilogue (E) against main (M, c054c0f), graph TFLOP/s A/B only.
# carry: [".device_run/me.tar.xz", ".device_run/callE2.sh"]
set -u
rm -rf /tmp/res; R=/tmp/res; mkdir -p $R
S=$R/summary.txt
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a $S; }
[ -d M ] && [ -d E ] || (xz -dc .device_run/me.tar.xz | tar xf -)
export PYTHONUNBUFFERED=1
stamp "$(nvidia-smi --query-gpu=name --format=csv,noheader)"
for round in 1 2; do
  for d in 128 64 256; do
    for pkg in M E; do
      PYTHONPATH=$PWD/$pkg/.device:$PWD timeout 60 python3 tools/gpu/prefill_profile.py --time --nofa3 --head_dim=$d 1x16384 4x4096 8x2048 trace 64x256 >> $R/pf${d}_$pkg.txt 2>&1
      stamp "d$d $pkg r$round rc=$? | $(grep -E 'TFLOP' $R/pf${d}_$pkg.txt | tail -n 5 | awk '{print $2, $5}' | tr '\n' ' ')"
    done
  done
done
mkdir -p $OUT/E2; cp -r $R/. $OUT/E2/ 2>/dev/null
