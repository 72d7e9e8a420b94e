REPO=$(pwd)
T0=$(date +%s)
cd $REPO && GEMVX_CUDA_ARCHS=90 python3 -m pip install --no-build-isolation --no-deps . > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "built $(( $(date +%s) - T0 )) s"
cd /tmp
export PYTHONUNBUFFERED=1
S=4096x4096,8192x8192,28672x8192,16384x16384,128256x4096,8192x28672,14336x4096,4096x14336
for P in 1 0 1 0; do
GEMVX_PDL=$P timeout 150 python3 -m gemvx.tune --dtypes float16 --layouts N,T --batches 1 --shapes $S --replays 20 --out /tmp/x$P.json --raw $OUT/raw_pdl$P.json > $OUT/tune$P.log 2>&1; echo "tune PDL=$P rc=$? $(( $(date +%s) - T0 )) s"
python3 - $OUT/raw_pdl$P.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for p in r["points"]:
    ok = [x for x in p["results"] if x["status"] == "ok"]
    b = min(ok, key=lambda x: x["us"])
    t = {(x["config"], x["splits"]): x["us"] for x in ok}
    print(f"{p['layout']} {p['M']}x{p['K']} best {b['config']}/{b['splits']} {b['us']:.2f}  87/1 {t.get((87,1),0):.2f} 90/1 {t.get((90,1),0):.2f} 91/1 {t.get((91,1),0):.2f} 83/1 {t.get((83,1),0):.2f} 18/1 {t.get((18,1),0):.2f}")
PY
done
