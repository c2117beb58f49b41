#!/usr/bin/env python3
"""Summarise a ktrace CSV (bench/ktrace/ktrace.cpp): time per kernel name over the whole run,
and the kernels of one decode step (from one sampling kernel to the next) with the idle gap
before each: where a decode step's time goes.
   ktrace_report.py trace.csv [--step N] [--first K]"""
import argparse, csv, re

ap = argparse.ArgumentParser()
ap.add_argument("csv")
ap.add_argument("--step", type=int, default=-20, help="which decode step (index among steps; negative from the end)")
ap.add_argument("--first", type=int, default=16, help="list the first K kernels of that step one by one")
a = ap.parse_args()

def short(n):
    n = n.replace("(anonymous namespace)::", "").replace("tessera::cuda::", "")
    n = re.sub(r"^void ", "", n)
    n = re.sub(r"\(.*", "", n)
    while re.search(r"<[^<>]*>", n):
        n = re.sub(r"<([^<>]*)>", lambda m: "[" + m.group(1)[:40] + "]", n)
    n = n.replace("tessera::cuda::", "").replace("(anonymous namespace)::", "")
    return n[:90]

rows = sorted(csv.DictReader(open(a.csv)), key=lambda r: int(r["start_ns"]))
for r in rows:
    r["s"], r["e"] = int(r["start_ns"]), int(r["end_ns"])
    r["k"] = short(r["name"])
tot = sum(r["e"] - r["s"] for r in rows)
agg = {}
for r in rows:
    s = agg.setdefault(r["k"], [0, 0, r["regs"], r["local_bytes"]])
    s[0] += 1; s[1] += r["e"] - r["s"]
print(f"{len(rows)} kernels, {tot/1e6:.2f} ms busy")
for k, (c, d, regs, lb) in sorted(agg.items(), key=lambda x: -x[1][1])[:25]:
    print(f"{100*d/tot:6.1f}% {c:7d} x {d/c/1000:8.2f} us regs {regs:>3} local {lb:>3}  {k}")

steps = [i for i, r in enumerate(rows) if "sampl" in r["k"].lower()]
if len(steps) > 3:
    j = a.step if a.step >= 0 else len(steps) - 1 + a.step
    j = max(0, min(len(steps) - 2, j))
    lo, hi = steps[j] + 1, steps[j + 1] + 1
    wall = rows[hi - 1]["e"] - rows[lo]["s"]
    busy = sum(r["e"] - r["s"] for r in rows[lo:hi])
    print(f"\ndecode step {j}: {hi-lo} kernels, {wall/1000:.1f} us from first start to last end, "
          f"{busy/1000:.1f} us busy, {(wall-busy)/1000:.1f} us idle between kernels")
    # With programmatic dependent launch kernels overlap, so a kernel's own duration
    # overstates its cost: "marginal" is how much later the step's latest end moves when
    # it ends (its end minus the latest end before it), which sums to the step's time.
    per = {}
    print(f"  host time between the previous step's last kernel and this step's first: "
          f"{(rows[lo]['s'] - rows[lo - 1]['e'])/1000:.1f} us")
    latest = rows[lo]["s"]
    for i in range(lo, hi):
        r = rows[i]
        gap = r["s"] - rows[i - 1]["e"] if i > lo else 0
        marginal = max(0, r["e"] - latest)
        latest = max(latest, r["e"])
        s = per.setdefault(r["k"] + f"  grid {r['grid']}", [0, 0, 0, 0])
        s[0] += 1; s[1] += r["e"] - r["s"]; s[2] += gap; s[3] += marginal
    print(f"  {'count':>5}   {'marginal':>9}   {'duration':>9}   {'idle before':>11}   kernel")
    for k, (c, d, g, m) in sorted(per.items(), key=lambda x: -x[1][3]):
        print(f"  {c:5d} x {m/c/1000:7.2f} us {d/c/1000:9.2f} us {g/c/1000:11.2f} us   {k}")
    print(f"first {a.first} kernels of the step:")
    for i in range(lo, min(hi, lo + a.first)):
        r = rows[i]
        gap = r["s"] - rows[i - 1]["e"]
        print(f"  {(r['e']-r['s'])/1000:7.2f} us  gap {gap/1000:5.2f}  grid {r['grid']:>6} x {r['block']:>4}  {r['k']}")
