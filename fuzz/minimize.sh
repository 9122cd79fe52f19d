#!/bin/sh
# Usage: fuzz/minimize.sh <target>: replaces fixtures/fuzz/<target>/ with a small set of
# inputs covering every edge that fuzz/corpus/<target>/ and the committed corpus reach
# (libFuzzer's set-cover merge, hit counts ignored, which keeps it to a few hundred files).
# Inputs named by hand (regressions: anything not a 40-hex libFuzzer name) are kept.
set -e
t=$1
cd "$(dirname "$0")/.."
bin=fuzz/target/x86_64-unknown-linux-gnu/release/$t
[ -x "$bin" ] || { echo "build it first: cargo +nightly fuzz build -s none -a $t" >&2; exit 1; }
out=$(mktemp -d)
nice -n 19 "$bin" -set_cover_merge=1 -use_counters=0 "$out" fuzz/corpus/$t fixtures/fuzz/$t \
  > fuzz/logs/$t.merge 2>&1
is_hash() { echo "$1" | grep -Eqx '[0-9a-f]{40}'; }
for f in fixtures/fuzz/$t/*; do
  if is_hash "$(basename "$f")"; then rm -f "$f"; fi
done
cp "$out"/* fixtures/fuzz/$t/
# a named input that the merge also kept under its hash is stored once, by name
for f in fixtures/fuzz/$t/*; do
  if ! is_hash "$(basename "$f")"; then
    rm -f "fixtures/fuzz/$t/$(sha1sum "$f" | cut -c1-40)"
  fi
done
rm -rf "$out"
echo "$t: $(ls fixtures/fuzz/$t | wc -l) files, $(cat fixtures/fuzz/$t/* | wc -c) bytes"
