"""The cases of one bench.json where splitkv trails the fastest FlashInfer / FA3 row: the plain
list of cells still behind a serving peer that a closing note gives (issue 18).

    python3 tools/bench/cells_behind.py docs/bench/<folder>/bench.json.xz [--timing=eager] [--match=REGEX]

The file may be xz-compressed (a name ending in .xz), as docs/bench/ stores them. The pairing
is bench.md's summary's (tools/bench/report.py peer_comparisons): decode per page size against
the peers on that page size, ragged prefill against ragged peers, `splitkv paged` against paged
ones; only rows whose output passed the float64 check count. Gap: splitkv's figure (bandwidth
or FLOP/s) over the peer's, minus 1, so negative means behind. Ends with how many of the cases
that have a peer are behind.
"""

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tools.bench import report  # noqa: E402


def behind(rows, timing="graph", match=""):
    """(comparison, gap) of each case whose splitkv figure trails its fastest serving peer's in
    `timing` ("graph" or "eager"), and the number of cases with both figures."""
    out, compared = [], 0
    for c in report.peer_comparisons(rows, "cuda"):
        own, peer = c[timing]["own"], c[timing]["serving"]
        if not (own and peer) or not re.search(match, f"{c['section']} {c['shape']}"):
            continue
        compared += 1
        if own < peer[1]:
            out.append((c, own / peer[1] - 1))
    return out, compared


def table(cells, compared, timing):
    lines = [f"| section | shape | page | splitkv {timing} | best FlashInfer / FA3 | gap |",
             "|---|---|---|---|---|---|"]
    for c, gap in cells:
        d, (impl, peer) = c["digits"], c[timing]["serving"]
        lines.append(f"| {c['section']} | {c['shape']} | {c['page'] or '-'} | {c[timing]['own']:.{d}f} "
                     f"{c['unit']} | {impl} {peer:.{d}f} | {100 * gap:+.1f} % |")
    lines.append(f"\n{len(cells)} of {compared} cases with a FlashInfer / FA3 row are behind ({timing}).")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_json")
    parser.add_argument("--timing", choices=("graph", "eager"), default="graph")
    parser.add_argument("--match", default="", help="Only '<section> <shape>' matching this regular expression.")
    args = parser.parse_args()
    cells, compared = behind(report.read_json(args.bench_json)["results"], args.timing, args.match)
    print(table(cells, compared, args.timing))


if __name__ == "__main__":
    main()
