#!/usr/bin/env bash
# Session 47 call 5, on ca90 (= main ed9b6b5's kernels): every d128 prefill row of the full
# preset beside FA3 and FlashInfer (issue 18's current gap after LoadInput as .ca), then the
# head_dim 256 fp8 1 x 32768 decode at forced 32 / 48 / 64 splits (issue 17's last d256 cell).
source tools/gpu/call_lib.sh .device_run/k4.tar.xz
mkdir -p $OUT/r
source tools/gpu/install_peers.sh .device_run/peers.tar.xz > $OUT/r/peers.txt 2>&1
export PYTHONPATH=/tmp/ab/ca90:$PWD/tests/python:$PWD:${PYTHONPATH:-}
log "prefill rows"
timeout 200 python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 --plot=false \
  --only='^prefill .*d128' --time_budget_s=170 --out_dir=$OUT/r/prefill > $OUT/r/prefill.log 2>&1
log "bench rc=$?"
timeout 60 python3 tools/gpu/decode_profile.py --time --head_dim=256 --fp8 1x32768 1x32768:HND:48 1x32768:HND:64 \
  > $OUT/r/probe.txt 2>&1
timeout 40 python3 tools/gpu/decode_profile.py --time --head_dim=256 1x32768 >> $OUT/r/probe.txt 2>&1
log "probe rc=$?"
log done
cp $OUT/log.txt $OUT/r/
tar cf - -C $OUT r | xz -9 > $OUT/r.tar.xz && rm -rf $OUT/r
