#!/bin/sh
# Usage: fuzz/run.sh <target> <seconds>: one libFuzzer process at nice 19, new inputs in
# fuzz/corpus/<target>, seeds from fixtures/fuzz/<target>, log in fuzz/logs/<target>.log.
set -e
t=$1; secs=$2
case $t in
  wire_*) dict=json ;; names) dict=uri ;; auth) dict=auth ;; config) dict=toml ;;
esac
cd "$(dirname "$0")/.."
mkdir -p fuzz/corpus/$t fuzz/logs
CARGO_INCREMENTAL=0 nice -n 19 cargo +nightly fuzz run -s none -a $t fuzz/corpus/$t fixtures/fuzz/$t -- \
  -dict=fuzz/dict/$dict.dict -max_total_time=$secs -max_len=4096 -print_final_stats=1 \
  -jobs=1 > fuzz/logs/$t.run 2>&1 || true
mv fuzz-0.log fuzz/logs/$t.log 2>/dev/null || true
