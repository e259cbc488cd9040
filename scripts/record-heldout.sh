#!/usr/bin/env bash
# Records the held-out trace set in tools/replay/traces/heldout/ (see its README):
# programs the policy was never tuned on (scripts/corpus/heldout.py), recorded with
# `strata trace record` as scripts/record-traces.sh records the corpus.
#
#   scripts/record-heldout.sh              # every kind
#   scripts/record-heldout.sh zip mixh     # some
#
# Environment: STRATA (default `strata` on PATH), PY (the Python with numpy, pyarrow,
# duckdb, pandas, zarr, h5py, safetensors; default python3), TORCH_PY (a Python with
# torch for `torch` and `valloader`; default $PY), WORK (data sets, default
# /tmp/strata-heldout, ~2 GB), OUT (default tools/replay/traces/heldout). The third
# round's `cligrep` also runs bash, GNU grep, gzip and tar; the fifth's `cheaders` runs gcc;
# the sixth's `pyimport` starts $PY itself, once per worker; the thirteenth's `tarlist` and
# `cmpjoin` run GNU tar and coreutils (join, cmp, tail); the fourteenth's `difftree` and `verify`
# run GNU diff and sha256sum under xargs; the fifteenth's `httpstatic` starts $PY's
# `http.server`, `sortmerge` runs GNU sort; the sixteenth's `logtail` runs GNU tail and
# `grepshards` GNU grep; the seventeenth's `zipimport` starts $PY 24 times, `arlink` runs
# gcc, GNU ar and ld; the eighteenth's `tacscan` runs GNU tac and grep, `symbolize` gcc and
# addr2line; the nineteenth's `sqldesc` uses Python's sqlite3; the twentieth's `sweep` starts $PY
# three times, each its own session; the twenty-first's `balanced` runs a Pool(4); the
# twenty-second's `mixture` and `traineval` a Pool(2); the twenty-third's `casstore` 4 threads,
# `resampled` a Pool(2); the twenty-fourth's `unziplookups` runs Info-ZIP unzip once per lookup; the
# twenty-fifth's `driftserve` runs Node.js, `jqwindow` runs jq once per query; the
# twenty-sixth's `nodestart` starts Node.js 30 times, `zstdepochs` runs zstd under xargs -P 2;
# the twenty-seventh's `nmsyms` runs GNU nm over copies of this machine's shared libraries; the
# twenty-eighth's `tenantdb` uses Python's sqlite3 from 4 threads, `kafkalag` and `ecobjects` the
# standard library only.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
STRATA=${STRATA:-strata}
PY=${PY:-python3}
TORCH_PY=${TORCH_PY:-$PY}
WORK=${WORK:-/tmp/strata-heldout}
OUT=${OUT:-$repo/tools/replay/traces/heldout}
H="$repo/scripts/corpus/heldout.py"
kinds=("$@")
[ "${#kinds[@]}" -gt 0 ] || kinds=(duckdb sqlrange zip torch pandas zarr loader3 mixh zipdeflate sqljoin h5cols tarrandom parquetrg embed feather tpslice cligrep jsonlog valloader mixh3 tokwin lora cheaders audiocrop vodstream mixh4 pyimport ivfsearch mixh5 diskann tfinterleave mixh6 lsmkv ragdocs mixh7 tileserve restore mixh8 ftsearch headscan mixh9 mboxsearch bisectlog mixh10 dbmlookup csvloop mixh11 tarlist cmpjoin mixh12 difftree verify mixh13 httpstatic sortmerge mixh14 logtail grepshards mixh15 zipimport arlink mixh16 tacscan symbolize graphwalk mixh17 parload sqldesc mixh18 sweep ckptavg bgzf mixh19 balanced curriculum dedup mixh20 mixture traineval mixh21 casstore resampled mixh22 hfhub unziplookups mixh23 driftserve jqwindow mixh24 nodestart zstdepochs mixh25 nmsyms mixh26 tenantdb kafkalag ecobjects mixh27)
mkdir -p "$WORK" "$OUT"

py_for() { if [ "$1" = torch ] || [ "$1" = valloader ]; then echo "$TORCH_PY"; else echo "$PY"; fi; }

gen() { echo "generating $1 in $WORK/$1" >&2; "$(py_for "$1")" "$H" gen "$1" "$WORK/$1"; }

record() {
  local name=$1
  shift
  (cd "$WORK" && "$STRATA" trace record --root "$WORK" --out "$OUT/$name.csv.gz" -- "$@")
}

# A multi-tenant trace: the parts' programs at once, one process group each.
record_mix() {
  local name=$1
  shift
  local script="set -m"
  for part in "$@"; do
    gen "$part"
    script+=$'\n'"$PY $H run $part $WORK/$part &"
  done
  record "$name" bash -c "$script"$'\n'"wait"
}

for k in "${kinds[@]}"; do
  case "$k" in
    mixh) record_mix mixh sqlrange zip pandas ;;
    mixh3) record_mix mixh3 embed jsonlog cligrep ;;
    mixh4) record_mix mixh4 cheaders audiocrop vodstream ;;
    mixh5) record_mix mixh5 pyimport ivfsearch tokwin ;;
    mixh6) record_mix mixh6 diskann tfinterleave lora ;;
    mixh7) record_mix mixh7 lsmkv ragdocs jsonlog ;;
    mixh8) record_mix mixh8 tileserve restore sqljoin ;;
    mixh9) record_mix mixh9 ftsearch headscan embed ;;
    mixh10) record_mix mixh10 mboxsearch bisectlog tileserve ;;
    mixh11) record_mix mixh11 dbmlookup csvloop sqlrange ;;
    mixh12) record_mix mixh12 tarlist cmpjoin ftsearch ;;
    mixh13) record_mix mixh13 difftree verify dbmlookup ;;
    mixh14) record_mix mixh14 httpstatic sortmerge bisectlog ;;
    mixh15) record_mix mixh15 logtail grepshards tarlist ;;
    mixh16) record_mix mixh16 zipimport arlink httpstatic ;;
    mixh17) record_mix mixh17 tacscan symbolize graphwalk ;;
    mixh18) record_mix mixh18 parload sqldesc tacscan ;;
    mixh19) record_mix mixh19 sweep ckptavg bgzf ;;
    mixh20) record_mix mixh20 balanced curriculum dedup ;;
    mixh21) record_mix mixh21 mixture traineval curriculum ;;
    mixh22) record_mix mixh22 casstore resampled lsmkv ;;
    mixh23) record_mix mixh23 hfhub unziplookups resampled ;;
    mixh24) record_mix mixh24 driftserve jqwindow sqljoin ;;
    mixh25) record_mix mixh25 nodestart zstdepochs hfhub ;;
    mixh26) record_mix mixh26 nmsyms driftserve zstdepochs ;;
    mixh27) record_mix mixh27 tenantdb kafkalag ecobjects ;;
    *)
      gen "$k"
      record "$k" "$(py_for "$k")" "$H" run "$k" "$WORK/$k"
      ;;
  esac
done
