//! Loopback ports a test must name before anything listens on them (a
//! replica restarted on the port HAProxy points at, a PostgreSQL cluster,
//! an admin listener the test dials).
//!
//! A port found by binding port 0 and releasing it can be taken again
//! before its user binds it: every `bind(…:0)` and every outgoing
//! connection draws from the kernel's ephemeral range
//! (`net.ipv4.ip_local_port_range`), and a relay's own admin listener
//! binds port 0. [`reserved_port`] therefore hands out ports *below* that
//! range, where the kernel never allocates on its own, each at most once
//! per process, and only ones nothing is bound to right now.

use std::net::{Ipv4Addr, TcpListener};
use std::sync::Mutex;

/// A loopback TCP port outside the kernel's ephemeral range that nothing
/// listens on and this process has not handed out before. Falls back to an
/// ephemeral port (bound and released) only where the range leaves no room.
pub fn reserved_port() -> u16 {
    static NEXT: Mutex<Option<u32>> = Mutex::new(None);
    let (low, high) = outside_ephemeral();
    let span = high - low;
    let mut next = NEXT.lock().unwrap_or_else(|e| e.into_inner());
    // Parallel test processes start at different offsets.
    let cursor = next.get_or_insert_with(|| std::process::id().wrapping_mul(7919) % span.max(1));
    for _ in 0..span {
        let port = low + *cursor % span;
        *cursor += 1;
        let Ok(port) = u16::try_from(port) else {
            continue;
        };
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return port;
        }
    }
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// The ports `[low, high)` to choose from: the 16,384 (at most) below the
/// ephemeral range, above the privileged ports.
fn outside_ephemeral() -> (u32, u32) {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    let high = ephemeral_low.clamp(1025, 65536);
    let low = high.saturating_sub(16384).max(1024);
    (low, high)
}
