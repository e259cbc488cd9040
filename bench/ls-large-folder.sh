#!/usr/bin/env bash
# `ls -l` of a 20,000-file folder through a mount of a local directory store: cold (first
# listing) and warm (twice more), seconds. Used to compare builds side by side (docs/BENCHMARKS.md
# "Black-box fault hunt, round 10"): run it alternately for each build.
#
# usage: bench/ls-large-folder.sh STRATA_BIN TAG [WORKDIR]
set -eu
BIN=${1:?usage: ls-large-folder.sh STRATA_BIN TAG [WORKDIR]}
TAG=${2:?tag}
W=${3:-/tmp/strata-lsperf}
if [ ! -d "$W/store/d" ] || [ "$(ls "$W/store/d" | wc -l)" -ne 20000 ]; then
  mkdir -p "$W/store/d"
  python3 -c "
import sys
for i in range(20000):
    open(f'{sys.argv[1]}/f{i:05d}', 'wb').write(b'x')
" "$W/store/d"
fi
M=$W/mnt-$TAG C=$W/cache-$TAG
fusermount3 -u -z "$M" 2>/dev/null || true
rm -rf "$C"; mkdir -p "$M"
"$BIN" mount "file://$W/store" "$M" --cache-dir "$C" --metadata-ttl 60 > "$W/log-$TAG" 2>&1 &
PID=$!
trap 'fusermount3 -u -z "$M" 2>/dev/null || true; kill $PID 2>/dev/null || true' EXIT
for _ in $(seq 50); do mountpoint -q "$M" && break; sleep 0.2; done
t() { local s e; s=$(date +%s.%N); ls -l "$M/d" > /dev/null; e=$(date +%s.%N); echo "$e - $s" | bc; }
echo "$TAG cold $(t) warm $(t) warm2 $(t)"
