//! The buffer a session's envelopes are spliced into: runs of envelopes
//! take their bytes one after another from a shared chunk, so a streamed
//! envelope costs no allocation of its own (contract §5.4's buffer holds
//! slices of a few chunks, not one allocation per envelope).
//!
//! Guarantees: a chunk is freed when the last envelope spliced into it is
//! dropped (the replay buffer evicts oldest first, so chunks go in order);
//! what a session pins beyond its envelopes' bytes is the unused rest of
//! its current chunk and the evicted part of its oldest one, each at most
//! [`Chunk::limit`] bytes. Chunks start small and double up to that limit,
//! so a session that receives a few envelopes keeps a small chunk and an
//! idle one (no envelope yet) keeps none.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use bytes::BytesMut;

/// The first chunk's size.
const FIRST: usize = 1024;

/// The largest chunk: 16 KiB, about forty 400-byte deltas per allocation.
/// A run expecting more than half of it gets an allocation of its own
/// ([`Chunk::suits`]), so a long batch never strands a chunk's rest.
pub(super) const LARGEST: usize = 16 * 1024;

/// A session's current chunk: its unused capacity, and the size of the
/// next one.
#[derive(Debug)]
pub(super) struct Chunk {
    spare: BytesMut,
    next: usize,
}

impl Chunk {
    /// No chunk yet; the first one is [`FIRST`] bytes.
    pub(super) fn new() -> Self {
        Self {
            spare: BytesMut::new(),
            next: FIRST,
        }
    }

    /// The largest chunk a session whose replay buffer holds at most
    /// `replay_bytes` uses: [`LARGEST`], or an eighth of a smaller buffer's
    /// bound (never below [`FIRST`]), so what a chunk pins stays small
    /// against what the buffer may hold.
    pub(super) fn limit(replay_bytes: usize) -> usize {
        LARGEST.min(replay_bytes / 8).max(FIRST)
    }

    /// Whether a run expecting `bytes` is spliced into the session's chunk
    /// (at most half the largest chunk), not into an allocation of its own.
    pub(super) fn suits(bytes: usize, limit: usize) -> bool {
        bytes <= limit / 2
    }

    /// The chunk's unused capacity, with room for at least `bytes`: a new
    /// chunk when the current one has less left (the old one lives on in
    /// the envelopes that hold slices of it). The caller splits what it
    /// writes off the front and gives the rest back ([`Chunk::give_back`]).
    pub(super) fn take(&mut self, bytes: usize, limit: usize) -> BytesMut {
        if self.spare.capacity() - self.spare.len() < bytes {
            let size = self.next.min(limit).max(bytes);
            self.next = self.next.saturating_mul(2).min(limit);
            self.spare = Spares::take(size).unwrap_or_else(|| BytesMut::with_capacity(size));
        }
        std::mem::take(&mut self.spare)
    }

    /// Returns what is left of the chunk [`Chunk::take`] gave, once the
    /// run's bytes were split off it.
    pub(super) fn give_back(&mut self, rest: BytesMut) {
        self.spare = rest;
    }

    /// Unused bytes of the current chunk.
    pub(super) fn spare(&self) -> usize {
        self.spare.capacity() - self.spare.len()
    }
}

/// Chunks of [`LARGEST`] bytes whose pages were touched ahead of use by a
/// thread of their own ([`prefault`]), so a session moving to a new chunk
/// on an edge thread takes no page fault there. A streamed session moves
/// every ~40 envelopes; on fresh memory (a replay buffer still growing)
/// each move costs four first-touch faults, which delay the envelope being
/// spliced and every frame behind it on that thread. The thread runs under
/// `SCHED_IDLE`: it fills the pool only when a core has nothing else to
/// run, so it never takes a core from an edge thread, a host or a client.
/// When the pool is empty a chunk is allocated where it is needed, as
/// without the pool.
struct Spares {
    ready: Mutex<Vec<BytesMut>>,
    /// How many the thread keeps ready; it is woken at half.
    keep: usize,
    /// Whether the thread was asked to refill since it last finished.
    asked: AtomicBool,
    thread: std::thread::Thread,
}

static SPARES: OnceLock<Spares> = OnceLock::new();

/// How long the pool's thread waits unasked before it tidies.
const TIDY_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// What the pool's thread runs once it has been idle ([`on_tidy`]).
static TIDY: OnceLock<fn()> = OnceLock::new();

/// Sets what the pool's thread runs after [`TIDY_AFTER`] without a request
/// (once per idle spell, and only if it allocated since the last): the
/// binary passes its allocator's collection of frees made on other threads
/// to blocks this thread allocated, which it would otherwise collect only
/// when it allocates again (mimalloc may then return pages left empty).
/// The first hook set stays.
pub fn on_tidy(hook: fn()) {
    let _ = TIDY.set(hook);
}

impl Spares {
    /// A touched chunk of `size` bytes from the process's pool, if it runs
    /// and `size` is its chunks' size ([`LARGEST`]).
    fn take(size: usize) -> Option<BytesMut> {
        SPARES.get().filter(|_| size == LARGEST)?.pop()
    }

    /// A ready chunk, if any; asks the thread for a refill at half.
    fn pop(&self) -> Option<BytesMut> {
        let (chunk, left) = {
            let mut ready = self.ready.lock().ok()?;
            (ready.pop(), ready.len())
        };
        if left <= self.keep / 2 && !self.asked.swap(true, Ordering::AcqRel) {
            self.thread.unpark();
        }
        chunk
    }

    /// The thread's loop: fill to `keep`, sleep until asked. While nobody
    /// asks for [`TIDY_AFTER`], it runs the tidy hook ([`on_tidy`]) once:
    /// chunks are allocated here and freed on other threads, and an
    /// allocator may keep such frees pending until this thread allocates
    /// again, which an idle relay never asks it to.
    fn fill(&self) {
        let mut tidy = false;
        loop {
            self.asked.store(false, Ordering::Release);
            while self.ready.lock().is_ok_and(|r| r.len() < self.keep) {
                tidy = true;
                let chunk = touched(LARGEST);
                match self.ready.lock() {
                    Ok(mut ready) => ready.push(chunk),
                    Err(_) => return,
                }
            }
            if !tidy {
                std::thread::park();
                continue;
            }
            let since = std::time::Instant::now();
            std::thread::park_timeout(TIDY_AFTER);
            if since.elapsed() >= TIDY_AFTER {
                if let Some(hook) = TIDY.get() {
                    hook();
                }
                tidy = false;
            }
        }
    }
}

/// A chunk of `size` bytes with every page written once.
fn touched(size: usize) -> BytesMut {
    let mut chunk = BytesMut::with_capacity(size);
    for byte in chunk.spare_capacity_mut().iter_mut().step_by(4096) {
        byte.write(0);
    }
    std::hint::black_box(chunk.spare_capacity_mut().as_ptr());
    chunk
}

/// Starts the thread that keeps `keep` touched chunks ready (at most once
/// per process; 0 keeps none and starts nothing). Returns whether it runs.
pub fn prefault(keep: usize) -> std::io::Result<bool> {
    start(&SPARES, keep)
}

/// Starts a pool in `place` (once) with its thread.
fn start(place: &'static OnceLock<Spares>, keep: usize) -> std::io::Result<bool> {
    if keep == 0 || place.get().is_some() {
        return Ok(place.get().is_some());
    }
    let handle = std::thread::Builder::new()
        .name("prefault".into())
        .spawn(move || {
            idle_priority();
            // The pool is in `place` before the unpark below.
            std::thread::park();
            if let Some(spares) = place.get() {
                spares.fill();
            }
        })?;
    let thread = handle.thread().clone();
    let spares = Spares {
        ready: Mutex::new(Vec::with_capacity(keep)),
        keep,
        asked: AtomicBool::new(true),
        thread: thread.clone(),
    };
    let started = place.set(spares).is_ok();
    thread.unpark();
    Ok(started)
}

/// Moves the calling thread to `SCHED_IDLE` (no privilege needed to lower
/// a thread's policy); elsewhere, or if refused, it stays as it is.
fn idle_priority() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: pid 0 is the calling thread; `param` is a valid
        // `sched_param` the kernel only reads.
        let _ = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_double_up_to_the_limit_and_serve_runs_from_their_rest() {
        let limit = Chunk::limit(4 * 1024 * 1024);
        assert_eq!(limit, LARGEST);
        let mut chunk = Chunk::new();
        assert_eq!(chunk.spare(), 0, "no chunk before the first envelope");
        let mut sizes = Vec::new();
        let mut kept: Vec<bytes::Bytes> = Vec::new();
        for i in 0..200u8 {
            let fresh = chunk.spare() < 400;
            let mut arena = chunk.take(400, limit);
            if fresh {
                sizes.push(arena.capacity());
            }
            arena.extend_from_slice(&[i; 400]);
            kept.push(arena.split().freeze());
            chunk.give_back(arena);
        }
        // 2 + 5 + 10 + 20 envelopes fill the growing chunks, 40 each after.
        assert_eq!(
            sizes,
            [1024, 2048, 4096, 8192, 16384, 16384, 16384, 16384, 16384]
        );
        // Within a chunk, each envelope's bytes follow the previous one's:
        // the only breaks are the eight moves to a new chunk.
        let breaks = kept
            .windows(2)
            .filter(|w| w[0].as_ptr() as usize + w[0].len() != w[1].as_ptr() as usize)
            .count();
        assert_eq!(breaks, sizes.len() - 1);
        assert!(
            kept.iter()
                .enumerate()
                .all(|(i, k)| k.len() == 400 && k.iter().all(|&c| c == i as u8))
        );
    }

    #[test]
    fn a_small_replay_bound_keeps_chunks_small_and_long_runs_apart() {
        assert_eq!(Chunk::limit(32 * 1024), 4 * 1024);
        assert_eq!(Chunk::limit(1024), FIRST);
        assert!(Chunk::suits(2048, 4096));
        assert!(!Chunk::suits(2049, 4096));
        let mut chunk = Chunk::new();
        // A run larger than a chunk still gets the room it needs.
        let arena = chunk.take(10_000, 4096);
        assert!(arena.capacity() >= 10_000);
    }

    /// Minor page faults taken by the calling thread so far.
    fn faults_here() -> i64 {
        let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: `usage` is a writable `rusage`; RUSAGE_THREAD is the caller.
        let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, usage.as_mut_ptr()) };
        assert_eq!(rc, 0);
        // SAFETY: getrusage succeeded and filled it.
        unsafe { usage.assume_init() }.ru_minflt
    }

    #[test]
    fn pooled_chunks_are_touched_off_the_taking_thread_and_refilled() {
        static POOL: OnceLock<Spares> = OnceLock::new();
        assert!(start(&POOL, 8).expect("start the prefault thread"));
        let pool = POOL.get().expect("started");
        let wait_full = || {
            let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
            loop {
                let ready = pool.ready.lock().map_or(0, |r| r.len());
                if ready >= 8 {
                    return;
                }
                assert!(
                    std::time::Instant::now() < until,
                    "pool never filled: {ready}"
                );
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        };
        wait_full();
        let mut taken = Vec::new();
        for _ in 0..6 {
            let mut chunk = pool.pop().expect("a ready chunk");
            assert!(chunk.capacity() >= LARGEST);
            let before = faults_here();
            // Written in place: a 16 KiB array on this thread's fresh
            // stack would fault there, which is not the chunk's fault.
            bytes::BufMut::put_bytes(&mut chunk, 7, LARGEST);
            assert_eq!(
                faults_here() - before,
                0,
                "a pooled chunk faulted when written"
            );
            taken.push(chunk);
        }
        // Taking past half woke the thread, which filled the pool again.
        wait_full();
        assert!(taken.iter().all(|c| c.iter().all(|&b| b == 7)));
        // Left alone, the thread tidies once (it allocated since it last did).
        static TIDIED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        on_tidy(|| {
            TIDIED.fetch_add(1, Ordering::SeqCst);
        });
        let until = std::time::Instant::now() + 4 * TIDY_AFTER;
        while TIDIED.load(Ordering::SeqCst) == 0 {
            assert!(
                std::time::Instant::now() < until,
                "the idle pool never tidied"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        std::thread::sleep(2 * TIDY_AFTER);
        assert_eq!(
            TIDIED.load(Ordering::SeqCst),
            1,
            "tidied again without allocating"
        );
    }
}
