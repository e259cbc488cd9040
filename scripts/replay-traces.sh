# The replay corpus issue 13 judges the policy on, as "NAME PATH" lines in the array
# `traces`: the 10 recorded traces in the repo, the 7 generator workloads and both
# Mooncake traces from GEN (as scripts/replay-set.sh makes them). Sourced by
# replay-all.sh and replay-speed.sh, so both run the same set; needs ROOT and GEN.
# SET=heldout: the held-out traces instead (tools/replay/traces/heldout/, programs the
# policy was not tuned on), named ho-NAME.
traces=()
if [ "${SET:-}" = heldout ]; then
  for t in duckdb loader3 mixh pandas sqlrange torch zarr zip h5cols parquetrg sqljoin tarrandom zipdeflate \
    embed feather tpslice cligrep jsonlog valloader mixh3 tokwin lora \
    cheaders audiocrop vodstream mixh4 pyimport ivfsearch mixh5 diskann tfinterleave mixh6 lsmkv ragdocs mixh7 tileserve restore mixh8 ftsearch headscan mixh9 mboxsearch bisectlog mixh10 dbmlookup csvloop mixh11 tarlist cmpjoin mixh12 difftree verify mixh13 httpstatic sortmerge mixh14 logtail grepshards mixh15 zipimport arlink mixh16 tacscan symbolize graphwalk mixh17 parload sqldesc mixh18 sweep ckptavg bgzf mixh19 balanced curriculum dedup mixh20 mixture traineval mixh21 casstore resampled mixh22 hfhub unziplookups mixh23 driftserve jqwindow mixh24 nodestart zstdepochs mixh25 nmsyms mixh26 tenantdb kafkalag ecobjects mixh27; do
    traces+=("ho-$t $ROOT/tools/replay/traces/heldout/$t.csv.gz")
  done
  return 0 2>/dev/null || true
fi
for t in etl h5 loader mix mix4 npy parquet safetensors shards sqlite; do
  traces+=("$t $ROOT/tools/replay/traces/$t.csv.gz")
done
for w in mixed shards checkpoint preprocess train-small-files inference-skew kv-prefix; do
  traces+=("gen-$w $GEN/$w.csv")
done
for m in conversation synthetic; do
  traces+=("mooncake-$m $GEN/mooncake-$m.csv.gz")
done
