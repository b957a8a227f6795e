"""Two bench.json files of the same grid, side by side: splitkv's planned call before and
after (graph figures), each against the fastest FlashInfer row of its own run, and the
batch_invariant variant's cost over the default where both runs have it.

    python3 tools/bench/compare_grids.py BEFORE/bench.json AFTER/bench.json [--match=REGEX]

Either file may be xz-compressed (a name ending in .xz), as docs/bench/ stores them.

One line a (shape, page_size) present in both. Percent against FlashInfer: positive means
splitkv is faster (FlashInfer's time / splitkv's - 1). Only rows whose status is ok count.
"""

import argparse
import collections
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tools.bench import report  # noqa: E402

_OWN = "splitkv/planned"
_INVARIANT = "splitkv invariant/planned"


def load(path):
    """{(shape, page_size): {"impl/variant": graph seconds}} of a bench.json (or .json.xz)."""
    table = collections.defaultdict(dict)
    for row in report.read_json(path)["results"]:
        if row["status"] == "ok" and row.get("graph_seconds"):
            key = (row["shape"], row["case"].get("page_size"))
            table[key][f"{row['impl']}/{row.get('variant') or ''}"] = row["graph_seconds"]
    return table


def fastest_flashinfer(times):
    rows = [(t, name.split("/")[0]) for name, t in times.items() if name.startswith("flashinfer")]
    return min(rows) if rows else (None, None)


def _order(key):
    numbers = [int(n) for n in re.findall(r"\d+", key[0])]
    return (key[1] or 0, numbers)


def lines(before, after, match=""):
    out = []
    for key in sorted(set(before) & set(after), key=_order):
        if not re.search(match, key[0]):
            continue
        b, a = before[key].get(_OWN), after[key].get(_OWN)
        (fb, _), (fa, peer) = fastest_flashinfer(before[key]), fastest_flashinfer(after[key])
        if not (b and a and fb and fa):
            continue
        text = (f"{key[0]:18s} page {key[1]}: {b * 1e6:9.1f} -> {a * 1e6:9.1f} us ({100 * (a / b - 1):+5.1f} %), "
                f"vs FlashInfer {100 * (fb / b - 1):+5.1f} -> {100 * (fa / a - 1):+5.1f} % ({peer})")
        ib, ia = before[key].get(_INVARIANT), after[key].get(_INVARIANT)
        if ib and ia:
            text += f", invariant cost {100 * (ib / b - 1):+5.1f} -> {100 * (ia / a - 1):+5.1f} %"
        out.append(text)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--match", default="", help="Only shapes matching this regular expression.")
    args = parser.parse_args()
    print("\n".join(lines(load(args.before), load(args.after), args.match)))


if __name__ == "__main__":
    main()
