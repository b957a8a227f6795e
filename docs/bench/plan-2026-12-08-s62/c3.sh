#!/usr/bin/env bash
# Session 62 call 3: k18 beside FlashInfer / FA3. The fp8 decode rows beside bf16 (issue 17),
# the d128 prefill rows beside the peers (issue 18), then gpt-oss-20b's whole trace (issue 17).
source tools/gpu/call_lib.sh .device_run90/kits.tar.xz
source tools/gpu/install_peers.sh .device_run90/peers.tar.xz > $OUT/peers.txt 2>&1
export PYTHONPATH=$CALL_PKGS/k18:$PWD/tests/python:$PWD:${PYTHONPATH:-}
timeout 130 python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 \
  --plot=false --only='^decode (24 x 4096|1 x 32768) d(64|128|256)$' --time_budget_s=110 \
  --out_dir=$OUT/fp8 > $OUT/fp8.log 2>&1; log "fp8 decode bench rc=$?"
timeout 150 python3 tools/bench/bench.py --device=cuda --shapes=full --noflex --max_gather_gb=0 \
  --plot=false --only='^prefill (4 x 4096|8 x 2048|1 x 16384) d128$' --time_budget_s=130 \
  --out_dir=$OUT/prepeers > $OUT/prepeers.log 2>&1; log "prefill+peers bench rc=$?"
timeout $(left 585) python3 tools/replay/replay.py --device=cuda --model=gpt-oss-20b --max_requests=0 \
  --check_every=200 --noprogress > $OUT/replay_gptoss.txt 2>&1
log "gpt-oss replay rc=$?"; tail -16 $OUT/replay_gptoss.txt >> $OUT/log.txt
log done
