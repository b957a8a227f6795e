#!/usr/bin/env bash
# Session 57 call 3 (two GPUs): main aaf7c75's package (k6). Every GPU test, with the NCCL
# context-parallel test on two ranks and the new multi_device_test (calls on the GPU that is not
# current); then the replay with --context_parallel=2 over NCCL, one GPU a rank: the default 200
# requests, the whole trace, and gpt-oss-20b over an fp8 cache with --batch_invariant.
source tools/gpu/call_lib.sh .device_run76/kits.tar.xz
nvidia-smi --query-gpu=index,name --format=csv >> $OUT/gpu.txt
export PYTHONPATH=$CALL_PKGS/k6:tests/python:.
timeout 90 python3 -m pytest tests/python/multi_device_test.py tests/python/distributed_test.py -m gpu -q -rs -p no:cacheprovider > $OUT/pytest_multi.log 2>&1
log "multi-GPU tests rc=$?"; grep -E "^(FAILED|ERROR)" $OUT/pytest_multi.log | head; tail -1 $OUT/pytest_multi.log | tee -a $OUT/log.txt
gpu_tests k6
cp=(python3 -m torch.distributed.run --standalone --nproc_per_node=2 tools/replay/replay.py --device=cuda --context_parallel=2 --noprogress)
timeout 90 "${cp[@]}" > $OUT/replay_cp_default.txt 2>&1
log "cp=2 default rc=$? $(grep -E 'result' $OUT/replay_cp_default.txt | tr '\n' ' ')"
timeout $(left 440) "${cp[@]}" --model=gpt-oss-20b --kv_dtype=fp8_e4m3 --batch_invariant --max_requests=400 --check_every=50 > $OUT/replay_cp_gptoss_fp8_inv.txt 2>&1
log "cp=2 gpt-oss fp8 invariant 400 rc=$? $(grep -E 'result|batch invariance' $OUT/replay_cp_gptoss_fp8_inv.txt | tr '\n' ' ')"
timeout $(left 555) "${cp[@]}" --max_requests=0 --check_every=200 > $OUT/replay_cp_whole.txt 2>&1
log "cp=2 whole trace rc=$? $(grep -E 'result|wall' $OUT/replay_cp_whole.txt | tr '\n' ' ')"
log done
