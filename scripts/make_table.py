"""Write a table file from sweep results (scripts/sweep.py --json): the best (config, splits)
per measured point. Usage: python scripts/make_table.py OUT.json --arch sm_90 SWEEP.json [...]

Within one sweep file the fastest (config, splits) of a point wins. Across files, a later file
replaces an earlier one for the points it measured: timings from different runs (machines,
clocks) are not compared with each other."""

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
        in_file: dict[tuple, tuple[float, int, int]] = {}
        for r in json.load(open(path)):
            key = (r["dtype"], r["layout"], r.get("nvec", 1), r["M"], r["K"])
            for cs, t in r["configs"].items():
                cid, splits = (int(v) for v in cs.split("/"))
                if key not in in_file or t < in_file[key][0]:
                    in_file[key] = (t, cid, splits)
        best.update(in_file)
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
