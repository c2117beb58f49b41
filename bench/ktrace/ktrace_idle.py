#!/usr/bin/env python3
"""How busy the GPU was in a ktrace CSV (bench/ktrace/ktrace.cpp): over the last part of the run
(--last-ms, default the last 200 ms: steady decode), the wall time, the time some kernel ran (the
union of the kernels' intervals) and the idle rest, and the idle gaps longer than --gap-us (host
round trips: the host waits for a result, then launches the next work), with the kernel before and
after each, counted by that pair.
   ktrace_idle.py trace.csv [--last-ms 200] [--gap-us 8]"""
import argparse, csv, re
from collections import Counter

ap = argparse.ArgumentParser()
ap.add_argument("csv")
ap.add_argument("--last-ms", type=float, default=200.0)
ap.add_argument("--gap-us", type=float, default=8.0)
a = ap.parse_args()


def short(n):
    n = n.replace("(anonymous namespace)::", "").replace("tessera::cuda::", "")
    n = re.sub(r"^void ", "", n)
    n = re.sub(r"[(<].*", "", n)
    return n[:48]


rows = sorted(csv.DictReader(open(a.csv)), key=lambda r: int(r["start_ns"]))
if not rows:
    raise SystemExit("no kernels in the trace")
end = max(int(r["end_ns"]) for r in rows)
lo = end - int(a.last_ms * 1e6)
rows = [r for r in rows if int(r["start_ns"]) >= lo]
busy, cur_s, cur_e = 0, None, None
gaps = Counter()
gap_ns = Counter()
prev = None
for r in rows:
    s, e = int(r["start_ns"]), int(r["end_ns"])
    if cur_e is None or s > cur_e:
        if cur_e is not None:
            busy += cur_e - cur_s
            if s - cur_e > a.gap_us * 1000:
                key = f"{short(prev['name'])} -> {short(r['name'])}"
                gaps[key] += 1
                gap_ns[key] += s - cur_e
        cur_s, cur_e = s, e
    else:
        cur_e = max(cur_e, e)
    prev = r
busy += cur_e - cur_s
wall = cur_e - int(rows[0]["start_ns"])
print(f"last {wall / 1e6:.1f} ms: {len(rows)} kernels, GPU busy {busy / 1e6:.1f} ms ({100 * busy / wall:.1f}%), "
      f"idle {(wall - busy) / 1e6:.1f} ms")
print(f"idle gaps over {a.gap_us:g} us, by the kernels around them:")
for k, c in gaps.most_common(12):
    print(f"  {c:6d} x {gap_ns[k] / c / 1000:7.1f} us  {k}")
