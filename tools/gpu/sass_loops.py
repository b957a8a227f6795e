"""Where the softmax of a wgmma kernel's main loop runs relative to its waits, from SASS.

    python3 tools/gpu/sass_loops.py .device/splitkv/_splitkv*.so           # PrefillSm90Kernel
    python3 tools/gpu/sass_loops.py --kernel=FlashAttnFwdSm90 flash_attn_3/_C.abi3.so
    cuobjdump -sass x.cubin | python3 tools/gpu/sass_loops.py -             # SASS on stdin
    python3 tools/gpu/sass_loops.py --check x.cubin    # exit 1 if a loop's softmax follows P V

For each kernel whose demangled name contains --kernel, every loop (a backward branch) that
holds both of the kernel's wgmma waits (WARPGROUP.DEPBAR.LE gsb0, 0x1: S of the next block
landed; ... 0x0: P V of this block landed) is listed with its static instruction count, its
HGMMAs, and the softmax's instructions (MUFU, FMNMX, FADD, FMUL) between the two waits and
after the second. A loop whose exponentials (MUFU) sit after the second wait runs the softmax
after P V instead of beside it (docs/perf_log.md 2026-12-05, session 41). Counts are static:
a loop's cold branches (soft cap, masks) count too.

Needs cuobjdump for a binary: the CUDA toolkit's, or PyPI's `nvidia-cuda-cuobjdump` wheel
(`pip install nvidia-cuda-cuobjdump`; it installs nvidia/cu13/bin/cuobjdump), which reads
sm_90a code on a machine without a GPU.
"""

import argparse
import collections
import dataclasses
import glob
import os
import re
import shutil
import subprocess
import sys

_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_FUNCTION = re.compile(r"Function : (\S+)")
# BRA, BRA.U, BRA.U.ANY, BRA.DIV ...; an optional predicate or register operand before the target.
_BRANCH = re.compile(r"\bBRA(?:\.[A-Z]+)*(?:\s+[^,\s]+,)?\s+0x([0-9a-f]+)")
_ARCH = re.compile(r"code for (sm_\w+)")
_PREDICATE = re.compile(r"^@!?U?P[T0-9]+\s+")
WAIT_S = "WARPGROUP.DEPBAR.LE gsb0, 0x1"
WAIT_PV = "WARPGROUP.DEPBAR.LE gsb0, 0x0"
SOFTMAX_OPS = ("MUFU", "FMNMX", "FADD", "FMUL")


@dataclasses.dataclass
class Loop:
    start: int  # address of the loop head (the backward branch's target)
    end: int  # address of the backward branch
    instructions: int
    hgmma: int
    between_waits: dict  # op -> count between WAIT_S and WAIT_PV
    after_pv_wait: dict  # op -> count from WAIT_PV to the backward branch


def mnemonic(text):
    """'@!P0 MUFU.EX2 R1, R2' -> 'MUFU.EX2' (the opcode with its modifiers)."""
    return _PREDICATE.sub("", text).split()[0]


def opcode(text):
    """'@!P0 FMUL.FTZ R1, R2, R3' -> 'FMUL'."""
    return mnemonic(text).split(".")[0]


def parse_functions(lines, arch="sm_90a"):
    """{mangled name: [(address, instruction text)]} from cuobjdump -sass output: the
    functions of `arch`'s code (a fat binary lists each architecture's; output without
    "code for" lines counts as `arch`)."""
    functions, name, current = {}, None, arch
    for line in lines:
        match = _ARCH.search(line)
        if match:
            current, name = match.group(1), None
            continue
        if current != arch:
            continue
        match = _FUNCTION.search(line)
        if match:
            name = match.group(1)
            functions.setdefault(name, [])  # a name listed twice (two ELF copies) keeps the first
            body = functions[name] if not functions[name] else None
            continue
        match = _INSTRUCTION.match(line)
        if match and name is not None and body is not None:
            body.append((int(match.group(1), 16), match.group(2)))
    return functions


def wait_loops(instructions):
    """The loops holding both wgmma waits, innermost (smallest) first."""
    loops = []
    for i, (address, text) in enumerate(instructions):
        match = _BRANCH.search(text)
        if not match or int(match.group(1), 16) >= address:
            continue
        head = int(match.group(1), 16)
        body = [t for a, t in instructions[: i + 1] if a >= head]
        first_s = next((j for j, t in enumerate(body) if WAIT_S in t), None)
        first_pv = next((j for j, t in enumerate(body) if WAIT_PV in t), None)
        if first_s is None or first_pv is None or first_pv < first_s:
            continue
        between = collections.Counter(opcode(t) for t in body[first_s:first_pv])
        after = collections.Counter(opcode(t) for t in body[first_pv:])
        loops.append(Loop(head, address, len(body), sum(opcode(t) == "HGMMA" for t in body),
                          {op: between[op] for op in SOFTMAX_OPS}, {op: after[op] for op in SOFTMAX_OPS}))
    return sorted(loops, key=lambda loop: loop.instructions)


def demangle(names):
    tool = shutil.which("c++filt")
    if tool is None:
        return list(names)
    result = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, check=True)
    return result.stdout.splitlines()


def softmax_after_pv_wait(loop):
    """Whether the loop runs part of its softmax (an exponential or a max) after P V's wait."""
    return loop.after_pv_wait["MUFU"] > 0 or loop.after_pv_wait["FMNMX"] > 0


def find_cuobjdump():
    tool = shutil.which("cuobjdump")
    if tool:
        return tool
    for entry in sys.path:
        for candidate in glob.glob(os.path.join(entry, "nvidia", "cu*", "bin", "cuobjdump")):
            return candidate
    raise SystemExit("cuobjdump not found: put the CUDA toolkit's bin on PATH or `pip install nvidia-cuda-cuobjdump`")


def sass_lines(binary):
    """cuobjdump -sass's lines for a binary's device code, or stdin's lines for "-"."""
    if binary == "-":
        return sys.stdin.read().splitlines()
    result = subprocess.run([find_cuobjdump(), "-sass", binary], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"cuobjdump -sass {binary} failed ({result.returncode}): {result.stderr.strip()[:300]}"
                         " (it needs nvdisasm on PATH too: pip install nvidia-cuda-nvdisasm)")
    return result.stdout.splitlines()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("binary", help="a cubin or a shared library with device code, or - for SASS on stdin")
    parser.add_argument("--kernel", default="PrefillSm90Kernel", help="substring of the demangled kernel name")
    parser.add_argument("--loops", type=int, default=1, help="loops to list a kernel, innermost first")
    parser.add_argument("--arch", default="sm_90a", help="the architecture's code to read in a fat binary")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if a matching kernel has no wait loop, or its innermost one runs"
                             " an exponential or a max after the P V wait")
    args = parser.parse_args(argv)
    functions = parse_functions(sass_lines(args.binary), args.arch)
    checked, failed = 0, []
    for mangled, name in zip(functions, demangle(list(functions))):
        if args.kernel not in name:
            continue
        loops = wait_loops(functions[mangled])
        print(name[:160])
        for loop in loops[: args.loops]:
            print(f"  loop {loop.start:#x}-{loop.end:#x}: {loop.instructions} instructions, {loop.hgmma} HGMMA;"
                  f" between the waits {loop.between_waits}; after the P V wait {loop.after_pv_wait}")
        checked += 1
        if not loops or softmax_after_pv_wait(loops[0]):
            failed.append(name[:160])
    if args.check:
        if checked == 0 or failed:
            print(f"FAIL: {len(failed)} of {checked} kernels matching {args.kernel!r} have no wait loop or run"
                  " softmax work after the P V wait" + "".join(f"\n  {n}" for n in failed))
            sys.exit(1)
        print(f"OK: {checked} kernels matching {args.kernel!r} run their softmax between the waits")


if __name__ == "__main__":
    main()
