"""Checks, in the SASS of the shipped sm_90a code, that every kernel splitkv launches with
programmatic dependent launch waits for the grid ahead of it before it touches global memory.

    python3 tools/gpu/sass_pdl_check.py .device/splitkv/_splitkv*.so
    cuobjdump -sass x.so | python3 tools/gpu/sass_pdl_check.py -

launch.h LaunchKernel launches the attention kernels with programmatic stream serialization,
so their CTAs may run before the previous grid has completed; each calls GridDependencyWait
(griddepcontrol.wait, ACQBULK in SASS) first. What the source orders, ptxas may not keep:
it moved __ldg loads (ld.global.nc, data promised constant while the kernel runs) of
cu_seqlens_q above the wait in 32 decode instances (docs/perf_log.md session 46). So this
reads each kernel's instructions in address order and fails (exit 1) when one has no ACQBULK
or has a global memory instruction (GLOBAL_OPS) before its first. Kernels launched without
the attribute (UNGATED: the merge_states op's) are skipped. Needs cuobjdump and nvdisasm: the
CUDA toolkit's, or without a GPU `pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm` with
nvidia/cu13/bin on PATH (cuobjdump calls nvdisasm).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tools.gpu.sass_loops import demangle, opcode, parse_functions, sass_lines  # noqa: E402

WAIT = "ACQBULK"
# Opcodes that read or write global memory (generic LD/ST may too), by their base name.
GLOBAL_OPS = frozenset({"LDG", "STG", "LD", "ST", "ATOM", "ATOMG", "RED", "LDGSTS", "UTMALDG", "UTMASTG",
                        "UTMAREDG", "UBLKCP", "UBLKRED", "UBLKPF", "SULD", "SUST", "SUATOM", "SURED"})
UNGATED = ("MergeStatesKernel",)


def first_global_before_wait(instructions):
    """(wait found, the first global memory instruction before the first wait, or None)."""
    for _, text in instructions:
        op = opcode(text)
        if op == WAIT:
            return True, None
        if op in GLOBAL_OPS:
            return False, text
    return False, None


def check(functions):
    """The gated kernels of {mangled name: instructions} that fail, as (mangled, reason), and
    how many were checked."""
    failed, checked = [], 0
    for mangled, instructions in functions.items():
        if "splitkv" not in mangled or any(u in mangled for u in UNGATED):
            continue
        checked += 1
        waited, early = first_global_before_wait(instructions)
        if early is not None:
            failed.append((mangled, f"{early} before {WAIT}"))
        elif not waited:
            failed.append((mangled, f"no {WAIT}"))
    return failed, checked


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("binary", help="a shared library with device code, or - for SASS on stdin")
    parser.add_argument("--arch", default="sm_90a", help="the architecture's code to read in a fat binary")
    args = parser.parse_args(argv)
    failed, checked = check(parse_functions(sass_lines(args.binary), args.arch))
    if checked == 0:
        print(f"FAIL: no splitkv kernel in the {args.arch} code")
        return 1
    if failed:
        names = demangle([m for m, _ in failed])
        print(f"FAIL: {len(failed)} of {checked} kernels may touch global memory before {WAIT}:")
        for name, (_, reason) in zip(names, failed):
            print(f"  {name[:150]}: {reason}")
        return 1
    print(f"OK: {checked} kernels wait ({WAIT}) before their first global memory instruction")
    return 0


if __name__ == "__main__":
    sys.exit(main())
