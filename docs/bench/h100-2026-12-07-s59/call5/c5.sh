#!/usr/bin/env bash
# Session 59 call 5: the DLPack exchange prototype (docs/bench/cpu-2026-12-07-s59) on the GPU
# machine's host: CUDA tensors' layouts read in C++ against the cached call's Python key and
# lookup, and the whole paged_attention(out=) call, main 53e3a63's package (k11 + its Python).
source tools/gpu/call_lib.sh .device_run84/kits.tar.xz
mkdir -p /tmp/proto && cp .device_run84/proto.cpython-312-x86_64-linux-gnu.so /tmp/proto/
for r in 1 2; do
  PYTHONPATH=/tmp/proto:$CALL_PKGS/k11 timeout 100 python3 docs/bench/cpu-2026-12-07-s59/time_proto.py cuda >> $OUT/proto_cuda.txt 2>&1
  log "proto cuda r$r rc=$?"
done
cat $OUT/proto_cuda.txt >> $OUT/log.txt
log done
