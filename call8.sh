REPO=$(pwd)
cd /tmp
mkdir -p /tmp/dump
XLA_FLAGS="--xla_dump_to=/tmp/dump" python3 $REPO/xp3.py 2>&1 | tail -2
ls /tmp/dump | head -50; ls /tmp/dump | wc -l
cd /tmp/dump && tar czf $OUT/dump.tgz $(ls | grep -E "ptx|after_optimizations.txt|thunk") && ls -la $OUT
