"""Write a table file from sweep results (scripts/sweep.py --json): the best (config, splits)
per measured point. Usage: python scripts/make_table.py OUT.json --arch sm_90 SWEEP.json [...]"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("sweeps", nargs="+")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--device", default=None)
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    best: dict[tuple, tuple[float, int, int]] = {}
    for path in args.sweeps:
        for r in json.load(open(path)):
            key = (r["dtype"], r["layout"], r.get("nvec", 1), r["M"], r["K"])
            for cs, t in r["configs"].items():
                cid, splits = (int(v) for v in cs.split("/"))
                if key not in best or t < best[key][0]:
                    best[key] = (t, cid, splits)
    entries = [
        {"dtype": d, "layout": lay, "batch": b, "M": M, "K": K, "config": c, "splits": s, "us": round(t, 2)}
        for (d, lay, b, M, K), (t, c, s) in sorted(best.items())
    ]
    table = {"format": 1, "arch": args.arch, "device": args.device, "note": args.note, "entries": entries}
    with open(args.out, "w") as f:
        json.dump(table, f, indent=1)
        f.write("\n")
    print(f"{len(entries)} entries -> {args.out}")


if __name__ == "__main__":
    main()
