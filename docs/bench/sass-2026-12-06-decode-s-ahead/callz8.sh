#!/usr/bin/env bash
# Device call Z8 (written in session 45 for the next H200; on an H100 it stops at once, both
# questions having been measured there). Packages in .device_run/abz8.tar.xz: main90 (main at or
# after 8f1d7d7), ring90 (main90's commit plus decode_s_ahead_d128_ring4.patch), old90 (af012ea).
# (1) The d128 batch-invariant decode, main against the 4-part ring on one-CTA-an-SM grids.
# (2) The d128 default decode route of 8f1d7d7 (wgmma-order tiles but on one-wave split grids)
#     against af012ea's bulk shape: decode_profile.py, inputs of ~1 GB, pages 16 and 64.
# carry: [".device_run/abz8.tar.xz", ".device_run/callz8.sh"]
source tools/gpu/call_lib.sh .device_run/abz8.tar.xz
on_h200 || { log "not an H200: nothing to run"; exit 0; }
log "d128 invariant A/B"; inv main90 128 1; inv ring90 128 1; inv ring90 128 2; inv main90 128 2
grep -E "^-- |1 x 32768|8 x 4096" "$OUT/inv128.txt" | tee -a "$OUT/log.txt"
SHAPES="64x1024 256x1024 64x2048 256x2048 64x4096 32x8192 16x4096"
log "d128 default route A/B"
for run in "old90 16" "main90 16" "main90 64" "old90 64" "old90 64" "main90 64" "main90 16" "old90 16"; do
  dprof $run $SHAPES
done
tee -a "$OUT/log.txt" < "$OUT/dprof.txt"
log done
