#!/usr/bin/env bash
# Regenerates pgo/relay.profdata, the profile the relay's optimised builds are
# compiled with (pgo/rustc-wrapper): builds the relay and the bench
# instrumented, runs the quick benchmark (every section: one and 50 streams
# flat out, the paced load, idle clients, listSessions, replay) and merges
# the relays' counts with the bench's own. Run it after changing the hot path,
# the dependencies or the toolchain; see pgo/README.md. Needs rustup's
# llvm-tools component (added when missing).
set -euo pipefail
cd "$(dirname "$0")/.."

sysroot=$(rustc --print sysroot)
host=$(rustc -vV | sed -n 's/^host: //p')
profdata="$sysroot/lib/rustlib/$host/bin/llvm-profdata"
if [ ! -x "$profdata" ]; then
  rustup component add llvm-tools
fi

gen="$PWD/target/pgo-train"
rm -rf "$gen/profiles"
mkdir -p "$gen/profiles"

# RUSTFLAGS replaces the wrapper's -Cprofile-use for these builds. The bench
# (the simhosts and clients of the load) is instrumented too: its counts keep
# the load source's code, which shares the library with the relay, from being
# compiled as cold.
export RUSTFLAGS="-Cprofile-generate=$gen/profiles/build"
cargo build --release --locked --target-dir "$gen" --bin ahp-relay
cargo bench --locked --target-dir "$gen" --bench relay --no-run

# The bench stops relays with SIGKILL; the instrumented relay writes its
# counts when it exits, so it runs under a wrapper that turns its own kill
# into the relay's SIGTERM (a graceful exit).
cat > "$gen/relay" <<EOF
#!/usr/bin/env bash
LLVM_PROFILE_FILE="$gen/profiles/relay-%p-%m.profraw" "$gen/release/ahp-relay" "\$@" &
child=\$!
me=\$\$
( while kill -0 \$me 2>/dev/null; do sleep 0.2; done; kill -TERM \$child ) >/dev/null 2>&1 &
wait \$child
EOF
chmod +x "$gen/relay"

LLVM_PROFILE_FILE="$gen/profiles/bench-%p-%m.profraw" AHP_BENCH_QUICK=1 AHP_BENCH_RELAY_BIN="$gen/relay" \
  cargo bench --locked --target-dir "$gen" --bench relay
# The last relays get their SIGTERM after the bench has exited.
sleep 3
for _ in $(seq 50); do
  pgrep -f "$gen/release/ahp-relay" >/dev/null || break
  sleep 0.2
done

shopt -s nullglob
counts=("$gen"/profiles/relay-*.profraw)
bench=("$gen"/profiles/bench-*.profraw)
[ ${#counts[@]} -gt 0 ] || { echo "no profile written by the instrumented relay" >&2; exit 1; }
"$profdata" merge --sparse -o pgo/relay.profdata "${counts[@]}" "${bench[@]}"
rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p' > pgo/llvm-major
echo "pgo/relay.profdata: $(wc -c < pgo/relay.profdata) bytes from ${#counts[@]} relay runs and the bench"
