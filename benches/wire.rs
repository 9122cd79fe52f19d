//! Hot-path cost of the wire layer against the naive `serde_json::Value` round trip.
//!
//! For each frame: (a) `classify` + `splice` of the rewritten numbers and strings,
//! (b) `from_str::<Value>`, mutate, `to_string`. Both produce the same JSON (checked
//! before timing). Heap allocations per frame are counted by a wrapping global
//! allocator. Run with `cargo bench --bench wire`; std only, no harness.
//! `AHP_WIRE_SCALE=0.01` scales the iteration counts (for `valgrind --tool=callgrind`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::error::Error;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use ahp_relay::wire::{Edit, EditValue, WireLimits, classify, classify_notification, splice};
use serde::de::IgnoredAny;
use serde_json::Value;

/// Client-facing channel the relay writes (host-qualified, §4.2).
const CHANNEL: &str = "ahp-chat:/gpu1~c-1";
/// Client-facing sequence number the relay writes (§5.1).
const SEQ: u64 = 1_760_000_000_123_456;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// The system allocator, counting allocations.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded unchanged to `System`, which upholds the contract.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: `ptr` was allocated by `System` with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// A ~320-byte `action` notification carrying a `chat/delta`.
fn action_frame() -> String {
    let content =
        r#"Here is the fix: replace `foo()` with \"bar()\" in src/lib.rs — then run cargo test.\n"#;
    format!(
        r#"{{"jsonrpc":"2.0","method":"action","params":{{"channel":"ahp-chat:/c-1","action":{{"type":"chat/delta","turnId":"t1","partId":"p1","content":"{content}"}},"serverSeq":12345,"origin":{{"clientId":"r1.Qm9iIHRoZSBi.dWlsZGVyIGZyb20g","clientSeq":3}}}}}}"#
    )
}

/// A ~2 KB `subscribe` response with a chat snapshot.
fn subscribe_frame() -> String {
    let turn = r#"{"id":"t0","message":{"text":"Please refactor the parser and add tests for escaped keys."},"responseParts":[{"kind":"markdown","content":"Done. I split the scanner into three passes and added property tests.\n"}],"state":"complete","usage":{"inputTokens":1234,"outputTokens":567}}"#;
    let turns = [turn; 6].join(",");
    format!(
        r#"{{"jsonrpc":"2.0","id":42,"result":{{"snapshot":{{"resource":"ahp-chat:/c-1","fromSeq":12000,"state":{{"resource":"ahp-chat:/c-1","title":"Parser refactor","turns":[{turns}],"draft":null,"_meta":{{"x":1}}}}}}}}}}"#
    )
}

/// (a): classify, then splice the sequence number and the channel (or snapshot resource).
fn splice_way(text: &str, limits: &WireLimits) -> Result<String> {
    let frame = classify(text, limits)?;
    let (seq, channel) = match &frame.result.snapshot {
        Some(snapshot) => (snapshot.from_seq.as_ref(), snapshot.resource.as_ref()),
        None => (
            frame.params.server_seq.as_ref(),
            frame.params.channel.as_ref(),
        ),
    };
    let (Some(seq), Some(channel)) = (seq, channel) else {
        return Err("frame lacks the values to rewrite".into());
    };
    let mut edits = [
        Edit {
            range: seq.range.clone(),
            replacement: EditValue::U64(SEQ),
        },
        Edit {
            range: channel.range.clone(),
            replacement: EditValue::JsonString(CHANNEL),
        },
    ];
    Ok(splice(text, &mut edits)?)
}

/// (b): build the whole tree, mutate it, serialize it again.
fn value_way(text: &str) -> Result<String> {
    let mut value: Value = serde_json::from_str(text)?;
    let target = match value.pointer("/result/snapshot") {
        Some(_) => "/result/snapshot",
        None => "/params",
    };
    let Some(Value::Object(object)) = value.pointer_mut(target) else {
        return Err("frame lacks the object to rewrite".into());
    };
    let (seq_key, channel_key) = if target == "/params" {
        ("serverSeq", "channel")
    } else {
        ("fromSeq", "resource")
    };
    object.insert(seq_key.into(), SEQ.into());
    object.insert(channel_key.into(), CHANNEL.into());
    Ok(serde_json::to_string(&value)?)
}

/// Rounds each measurement is split into; the fastest round is reported, which filters
/// out interference from other processes on a shared machine.
const ROUNDS: u32 = 5;

/// Nanoseconds and heap allocations per call of `run`: `iterations` calls in
/// [`ROUNDS`] rounds after a warm-up of a tenth, reporting the fastest round.
fn time(iterations: u32, mut run: impl FnMut() -> Result<String>) -> Result<(f64, f64)> {
    for _ in 0..iterations / 10 {
        black_box(run()?);
    }
    let per_round = (iterations / ROUNDS).max(1);
    let mut best = f64::MAX;
    let allocations = ALLOCATIONS.load(Ordering::Relaxed);
    for _ in 0..ROUNDS {
        let start = Instant::now();
        for _ in 0..per_round {
            black_box(run()?);
        }
        best = best.min(start.elapsed().as_nanos() as f64 / f64::from(per_round));
    }
    let allocations = (ALLOCATIONS.load(Ordering::Relaxed) - allocations) as f64;
    Ok((best, allocations / f64::from(per_round * ROUNDS)))
}

fn compare(name: &str, text: &str, iterations: u32) -> Result<()> {
    let limits = WireLimits::default();
    let (a, b) = (splice_way(text, &limits)?, value_way(text)?);
    if serde_json::from_str::<Value>(&a)? != serde_json::from_str::<Value>(&b)? {
        return Err(format!("{name}: the two ways disagree").into());
    }
    let (classify_only, classify_allocs) = time(iterations, || {
        classify(black_box(text), &limits)
            .map(|_| String::new())
            .map_err(Into::into)
    })?;
    let (validate_only, _) = time(iterations, || {
        serde_json::from_str::<IgnoredAny>(black_box(text))?;
        Ok(String::new())
    })?;
    let fast = match classify_notification(text, &limits) {
        Some(_) => {
            let (ns, _) = time(iterations, || {
                classify_notification(black_box(text), &limits)
                    .map(|_| String::new())
                    .ok_or_else(|| "declined".into())
            })?;
            format!(", action fast path {ns:.0}")
        }
        None => String::new(),
    };
    let (spliced, spliced_allocs) = time(iterations, || splice_way(black_box(text), &limits))?;
    let (round_trip, round_trip_allocs) = time(iterations, || value_way(black_box(text)))?;
    println!("{name} ({} bytes, {iterations} iterations):", text.len());
    println!(
        "  classify+splice: {spliced:.0} ns/frame (classify alone {classify_only:.0}{fast}, serde_json validation alone {validate_only:.0}); Value round trip: {round_trip:.0} ns/frame; ratio {:.1}x",
        round_trip / spliced
    );
    println!(
        "  heap allocations/frame: classify+splice {spliced_allocs:.1} (classify alone {classify_allocs:.1}); Value round trip {round_trip_allocs:.1}"
    );
    Ok(())
}

fn main() -> Result<()> {
    // `AHP_WIRE_SCALE=0.01` runs a hundredth of the iterations (for `valgrind`).
    let scale: f64 = std::env::var("AHP_WIRE_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let iterations = |n: f64| ((n * scale) as u32).max(100);
    compare(
        "action notification, chat/delta",
        &action_frame(),
        iterations(1e6),
    )?;
    let streamed = ahp_relay::simhost::stream::Template::new(
        "ahp-chat:/s-1-main",
        "turn-1",
        "turn-1-text",
        320,
    )
    .render(12345, 1_764_000_000_000_000);
    compare(
        "streamed chat/delta (the frame of `benches/relay.rs`)",
        streamed.as_str(),
        iterations(1e6),
    )?;
    compare(
        "subscribe response with snapshot",
        &subscribe_frame(),
        iterations(2e5),
    )?;
    Ok(())
}
