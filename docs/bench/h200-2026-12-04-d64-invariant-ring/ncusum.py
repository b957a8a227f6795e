"""Summarise `ncu -i REP --page source --csv --print-source sass`: stall reasons and the top instructions."""
import csv
import sys
rows = list(csv.reader(open(sys.argv[1])))
hdr_i = next(i for i, r in enumerate(rows) if any("Address" in c for c in r))
hdr = rows[hdr_i]
data = rows[hdr_i + 1:]
def col(name):
    return next((i for i, c in enumerate(hdr) if c == name), None)
print("columns:", hdr)
samp = col("Warp Stall Sampling (All Samples)")
src = col("Source")
addr = col("Address")
exe = col("Instructions Executed")
def num(x):
    try:
        return float(x.replace(",", ""))
    except Exception:
        return 0.0
stall_cols = [i for i, c in enumerate(hdr) if c.startswith("stall_") or c.startswith("Stall")]
tot = {hdr[i]: sum(num(r[i]) for r in data if len(r) > i) for i in stall_cols}
print("stall totals:", sorted(tot.items(), key=lambda kv: -kv[1])[:14])
if samp is not None:
    total = sum(num(r[samp]) for r in data)
    print("total samples", total)
    for r in sorted(data, key=lambda r: -num(r[samp]))[:40]:
        reasons = sorted(((hdr[i], num(r[i])) for i in stall_cols), key=lambda kv: -kv[1])[:3]
        print(f"{r[addr]:>8} {num(r[samp]):8.0f} {100*num(r[samp])/total:5.1f}% exe {r[exe] if exe is not None else ''} {r[src][:70]:70s} {reasons}")
