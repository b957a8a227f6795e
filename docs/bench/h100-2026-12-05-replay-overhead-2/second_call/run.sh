#!/usr/bin/env bash
# Stop 52: host time per call beside FlashInfer (issue 15) on E (0139c73).
# carry: [".device_run/e.tar.xz", ".device_run/callO.sh", ".device_peers/peers3.tar.xz"]
set -u
[ -d E ] || (xz -dc .device_run/e.tar.xz | tar xf -)
source tools/gpu/install_peers.sh .device_peers/peers3.tar.xz > /dev/null 2>&1
export PYTHONPATH=$PWD/E/.device:$PWD/tests/python:$PWD:${PYTHONPATH:-}
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/O
timeout 80 python3 tools/bench/overhead.py --device=cuda --issue_rows --out_dir=$OUT/O/oi > $OUT/O/overhead_oi.log 2>&1; echo "oi rc=$?"
timeout 50 python3 tools/bench/overhead.py --device=cuda --out_dir=$OUT/O/o2 > $OUT/O/overhead_o2.log 2>&1; echo "o2 rc=$?"
grep -E "interleaved|^\| decode (1 x 32768|16 x 4096|8 x 8192|64 x 4096)|ragged_attention\(out=\)|paged_attention\(out=\) \|" $OUT/O/overhead_oi.log | cut -c1-200
