//! The edge threads' scheduler slice (`[listen] edge_slice_us`).
//!
//! Linux's fair scheduler (EEVDF, kernel 6.12 and later) lets a thread ask
//! for a shorter time slice than the default (`sched_setattr` with
//! `sched_runtime`, clamped by the kernel to 0.1–100 ms; no privilege
//! needed). A woken thread's virtual deadline is its slice away, so a
//! thread with a short slice runs as soon as it wakes instead of queueing
//! behind whatever woke it on the same core (a host or client process in
//! the middle of its own default slice). Its share of the CPU is unchanged:
//! the weight (nice value) and the policy are kept, only the slice moves.
//!
//! An edge thread wakes when a host frame or a client frame arrives and
//! sleeps again within microseconds, which is the case short slices are
//! for; a proxy's added latency is the time a frame waits for it to run
//! (BENCHMARKS.md, "Nineteenth round"). Older kernels accept the call and
//! ignore the value; elsewhere it is not made.

use std::time::Duration;

/// Asks the kernel for `slice` as the calling thread's time slice, keeping
/// its policy and nice value. Threads under a real-time policy are left
/// alone (an operator put them there).
#[cfg(target_os = "linux")]
pub fn request(slice: Duration) -> std::io::Result<()> {
    let runtime = u64::try_from(slice.as_nanos()).unwrap_or(u64::MAX);
    let mut attr = libc::sched_attr {
        size: 0,
        sched_policy: 0,
        sched_flags: 0,
        sched_nice: 0,
        sched_priority: 0,
        sched_runtime: 0,
        sched_deadline: 0,
        sched_period: 0,
    };
    let size = std::mem::size_of::<libc::sched_attr>() as libc::c_uint;
    // SAFETY: `attr` is a live, writable `sched_attr` of `size` bytes; pid 0
    // is the calling thread; the kernel writes at most `size` bytes.
    let got = unsafe { libc::syscall(libc::SYS_sched_getattr, 0, &mut attr, size, 0) };
    if got != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if !matches!(
        attr.sched_policy as libc::c_int,
        libc::SCHED_OTHER | libc::SCHED_BATCH
    ) {
        return Ok(());
    }
    attr.size = size;
    attr.sched_runtime = runtime;
    // SAFETY: `attr` is a valid, initialised `sched_attr` whose `size` field
    // is its own size; pid 0 is the calling thread; the kernel only reads it.
    let set = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr, 0) };
    if set != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Not Linux: there is no slice to ask for.
#[cfg(not(target_os = "linux"))]
pub fn request(_slice: Duration) -> std::io::Result<()> {
    Ok(())
}

/// The time slice the kernel reports in a thread's `sched` file
/// (`/proc/thread-self/sched`, `/proc/<pid>/task/<tid>/sched`): its
/// `se.slice` line, which EEVDF kernels (6.6 and later) print; `None` where
/// there is none.
pub fn reported_slice(sched_file: &std::path::Path) -> Option<Duration> {
    let sched = std::fs::read_to_string(sched_file).ok()?;
    let line = sched.lines().find(|l| l.starts_with("se.slice"))?;
    let ns = line.rsplit(':').next()?.trim().parse().ok()?;
    Some(Duration::from_nanos(ns))
}

/// Whether the running kernel honours a requested slice: Linux 6.12 and
/// later, read from its release (`/proc/sys/kernel/osrelease`); older ones
/// accept [`request`] and ignore the value.
pub fn kernel_honours_slices() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    cfg!(target_os = "linux") && release_honours_slices(&release)
}

/// Whether a Linux release string (`6.12.0-1-amd64`) is 6.12 or later.
fn release_honours_slices(release: &str) -> bool {
    let mut parts = release
        .trim()
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (6, 12)
}

/// The calling thread's reported slice (tests).
#[cfg(all(test, target_os = "linux"))]
pub(crate) fn current_slice_ns() -> Option<u64> {
    let slice = reported_slice(std::path::Path::new("/proc/thread-self/sched"))?;
    u64::try_from(slice.as_nanos()).ok()
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_thread_gets_the_slice_it_asks_for_and_keeps_its_nice_value() {
        let seen = std::thread::spawn(|| {
            // A nice value of its own, which the request must keep.
            // SAFETY: `setpriority` on the calling thread (who 0); raising
            // one's own nice value needs no privilege.
            let _ = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 3) };
            let before = current_slice_ns();
            request(Duration::from_micros(250)).map_err(|e| e.to_string())?;
            Ok::<_, String>((before, current_slice_ns(), nice(), 3))
        })
        .join()
        .expect("thread");
        let (before, after, nice_after, nice_set) = seen.expect("sched_setattr");
        assert_eq!(nice_after, nice_set, "the nice value is kept");
        if !kernel_honours_slices() {
            // Kernels before 6.12 accept the call and keep their slice.
            assert_eq!(
                before, after,
                "a kernel that ignores the request keeps its slice"
            );
            eprintln!("skipped: this kernel predates custom slices");
            return;
        }
        assert_ne!(
            before,
            Some(250_000),
            "the default differs from the request"
        );
        assert_eq!(
            after,
            Some(250_000),
            "the thread runs with the slice it asked for"
        );
    }

    #[test]
    fn custom_slices_are_honoured_from_linux_6_12() {
        for (release, honoured) in [
            ("6.12.0", true),
            ("6.18.44", true),
            ("6.12.9-1-amd64\n", true),
            ("7.0.1", true),
            ("6.11.11", false),
            ("6.6.0-rt", false),
            ("5.15.0-105-generic", false),
            ("", false),
        ] {
            assert_eq!(release_honours_slices(release), honoured, "{release:?}");
        }
    }

    #[test]
    fn the_slice_is_per_thread() {
        let before = current_slice_ns();
        std::thread::spawn(|| request(Duration::from_micros(100)).map_err(|e| e.to_string()))
            .join()
            .expect("thread")
            .expect("sched_setattr");
        assert_eq!(
            current_slice_ns(),
            before,
            "another thread's request leaves this one"
        );
    }

    fn nice() -> i32 {
        // SAFETY: `getpriority` reads the calling thread's nice value.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) }
    }
}
