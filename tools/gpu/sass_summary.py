"""Summarises `cuobjdump -sass` output read from stdin: per kernel, the count of a few
instruction kinds (local-memory loads/stores mean spills; HMMA the tensor-core mma.sync;
LDGSTS cp.async; LDSM ldmatrix; MUFU.EX2 the exponentials). Parsing is sass_loops.py's."""

import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tools.gpu.sass_loops import demangle, mnemonic, parse_functions  # noqa: E402

KINDS = ["LDL", "STL", "HMMA", "LDGSTS", "LDSM", "MUFU.EX2", "BAR.SYNC", "ATOMG", "RED"]


def counts_of(instructions):
    """{kind: count} of KINDS in a function: a kind counts its modified forms (LDL.64 is an LDL)."""
    counter = collections.Counter()
    for _, text in instructions:
        op = mnemonic(text)
        for kind in KINDS:
            if op == kind or op.startswith(kind + "."):
                counter[kind] += 1
    return counter


def main():
    functions = parse_functions(sys.stdin.read().splitlines())
    print("kernel".ljust(60) + "".join(k.rjust(9) for k in KINDS))
    for mangled, name in zip(functions, demangle(list(functions))):
        counter = counts_of(functions[mangled])
        print(name.removeprefix("void splitkv::cuda::")[:58].ljust(60) + "".join(str(counter[k]).rjust(9) for k in KINDS))


if __name__ == "__main__":
    main()
