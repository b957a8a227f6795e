"""Summarises `cuobjdump -sass` output read from stdin: per kernel, the count of a few
instruction kinds (local-memory loads/stores mean spills; HMMA the tensor-core mma.sync;
LDGSTS cp.async; LDSM ldmatrix; MUFU.EX2 the exponentials)."""

import collections
import re
import sys

KINDS = ["LDL", "STL", "HMMA", "LDGSTS", "LDSM", "MUFU.EX2", "BAR.SYNC", "ATOMG", "RED"]


def main():
    counts = collections.OrderedDict()
    name = None
    for line in sys.stdin:
        match = re.search(r"Function : (\S+)", line)
        if match:
            name = match.group(1)
            counts[name] = collections.Counter()
            continue
        if name is None:
            continue
        match = re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", line)
        if match:
            op = match.group(1)
            for kind in KINDS:
                if op == kind or op.startswith(kind + "."):
                    counts[name][kind] += 1
    print("kernel".ljust(60) + "".join(k.rjust(9) for k in KINDS))
    for name, counter in counts.items():
        short = re.sub(r"_ZN7splitkv4cuda15AttentionKernelI", "", name)[:58]
        print(short.ljust(60) + "".join(str(counter[k]).rjust(9) for k in KINDS))


if __name__ == "__main__":
    main()
