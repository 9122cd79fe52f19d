//! The edge's threads: client connections run on a few single-threaded
//! runtimes, one per core by default (`[listen] edge_threads`), handed out
//! in turn at accept, the way each of nginx's workers owns its
//! connections. Everything a connection spawns — its WebSocket reader and
//! writer, its session's links — is spawned from its task and so stays on
//! its runtime: a session's state stays in one core's cache, and a frame
//! read from a host is written to the client without a hand-over to
//! another thread (BENCHMARKS.md, "Sixth round": the paced load's latency).
//!
//! Each runtime is a current-thread runtime driven by a thread of its own:
//! its park and wake-up paths are the shortest tokio has (no work-stealing
//! bookkeeping, no hand-off of the I/O driver), which is what a paced load
//! pays once per frame (BENCHMARKS.md, "Thirty-fourth round"). Nothing on an
//! edge thread blocks it: a URI-store commit a link must wait for (the
//! answer to a create, §4.5) runs on the blocking pool while the session
//! holds the link's later frames (`session::envelope`, `Hold`).
//!
//! Dropping the pool does not wait: each thread gives its connections up to
//! the pool's `linger` to finish (a stopped relay's sessions write their
//! close frames), then shuts its runtime down and drops what is left, so a
//! dropped relay leaves no connection behind.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::runtime::{Builder, Handle, Runtime};
use tokio::sync::watch;

/// Single-threaded runtimes that client connections are spread over.
#[derive(Debug)]
pub struct EdgePool {
    handles: Vec<Handle>,
    /// Tells the runtimes' threads when to stop: `Some(deadline)` once the
    /// pool is dropped (a dropped sender means at once).
    stop: watch::Sender<Option<Instant>>,
    next: AtomicUsize,
    /// How long a dropped pool's tasks may run on before they are dropped.
    linger: Duration,
}

impl EdgePool {
    /// How long the relay's pool lets connections finish once dropped.
    pub const LINGER: Duration = Duration::from_secs(10);

    /// `threads` current-thread runtimes, each on a thread named
    /// `ahp-edge-<n>` that asks the kernel for `slice` as its time slice
    /// when given (`edge::slice`); once dropped, their tasks have `linger`
    /// to end before they are dropped.
    pub fn new(threads: usize, linger: Duration, slice: Option<Duration>) -> std::io::Result<Self> {
        let (stop, told) = watch::channel(None);
        let mut handles = Vec::with_capacity(threads);
        for n in 0..threads {
            let runtime = Builder::new_current_thread().enable_all().build()?;
            handles.push(runtime.handle().clone());
            let told = told.clone();
            std::thread::Builder::new()
                .name(format!("ahp-edge-{n}"))
                .spawn(move || drive(runtime, slice, told))?;
        }
        Ok(Self {
            handles,
            stop,
            next: AtomicUsize::new(0),
            linger,
        })
    }

    /// The number of threads `[listen] edge_threads` asks for: `None` is one
    /// per core the process may use.
    pub fn threads_for(configured: Option<usize>) -> usize {
        configured.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    /// How many runtimes the pool has.
    pub fn len(&self) -> usize {
        self.handles.len()
    }

    /// Whether the pool has no runtime (never: [`EdgePool::new`] with 0
    /// threads is not used, connections then stay on the caller's runtime).
    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }

    /// Spawns `task` on the next runtime in turn (on the caller's runtime if
    /// the pool has none).
    pub fn spawn<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        match self.handles.get(n % self.handles.len().max(1)) {
            Some(h) => drop(h.spawn(task)),
            None => drop(tokio::spawn(task)),
        }
    }
}

/// An edge thread: asks for its slice (a refusal leaves the kernel's
/// default: slower wake-ups, never a failure), runs `runtime`'s tasks until
/// the pool is dropped, then until they have all ended or the deadline the
/// pool gave has passed, and drops what is left.
fn drive(runtime: Runtime, slice: Option<Duration>, mut stop: watch::Receiver<Option<Instant>>) {
    if let Some(slice) = slice
        && let Err(e) = super::slice::request(slice)
    {
        tracing::warn!(error = %e, "an edge thread keeps the kernel's default time slice");
    }
    let handle = runtime.handle().clone();
    runtime.block_on(async move {
        let until = match stop.wait_for(Option::is_some).await {
            Ok(until) => until.unwrap_or_else(Instant::now),
            Err(_) => Instant::now(),
        };
        while handle.metrics().num_alive_tasks() > 0 && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    runtime.shutdown_background();
}

impl Drop for EdgePool {
    fn drop(&mut self) {
        self.stop.send_replace(Some(Instant::now() + self.linger));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Arc;
    use std::time::Duration;

    /// Spawns on `pool` a task that reports its thread's name and, through
    /// its own spawn, the thread its child task ran on.
    async fn threads_of_one_task(pool: &EdgePool) -> (String, String) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        pool.spawn(async move {
            let me = std::thread::current().name().unwrap_or("").to_string();
            let child =
                tokio::spawn(async { std::thread::current().name().unwrap_or("").to_string() });
            let child = child.await.unwrap_or_default();
            let _ = tx.send((me, child));
        });
        rx.await.expect("the task ran")
    }

    #[tokio::test]
    async fn tasks_go_to_each_runtime_in_turn_and_their_children_stay_there() {
        let pool = EdgePool::new(2, Duration::ZERO, None).expect("runtimes");
        let mut seen = Vec::new();
        for _ in 0..4 {
            let (me, child) = threads_of_one_task(&pool).await;
            assert!(me.starts_with("ahp-edge-"), "{me}");
            assert_eq!(me, child, "a task's own spawns stay on its runtime");
            seen.push(me);
        }
        assert_eq!(seen[0], seen[2]);
        assert_eq!(seen[1], seen[3]);
        assert_ne!(seen[0], seen[1]);
        assert_eq!(seen.iter().collect::<HashSet<_>>().len(), pool.len());
    }

    /// Dropped when the task holding it is dropped.
    struct Dropped(Arc<std::sync::atomic::AtomicBool>);
    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// Spawns on `pool` a task that never ends; returns whether it was
    /// dropped, once it runs.
    async fn endless_task(pool: &EdgePool) -> Arc<std::sync::atomic::AtomicBool> {
        let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (started, running) = tokio::sync::oneshot::channel();
        let guard = Dropped(dropped.clone());
        pool.spawn(async move {
            let _guard = guard;
            let _ = started.send(());
            std::future::pending::<()>().await;
        });
        running.await.expect("the task started");
        dropped
    }

    /// Whether `flag` is set within `within`.
    async fn set_within(flag: &std::sync::atomic::AtomicBool, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while !flag.load(Ordering::SeqCst) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        flag.load(Ordering::SeqCst)
    }

    #[tokio::test]
    async fn a_dropped_pool_drops_what_is_left_after_its_linger() {
        let pool = EdgePool::new(1, Duration::from_millis(300), None).expect("runtimes");
        let dropped = endless_task(&pool).await;
        let at = std::time::Instant::now();
        drop(pool);
        assert!(
            !set_within(&dropped, Duration::from_millis(100)).await,
            "not before the linger"
        );
        assert!(
            set_within(&dropped, Duration::from_secs(5)).await,
            "dropped after it"
        );
        assert!(at.elapsed() >= Duration::from_millis(300));
    }

    #[tokio::test]
    async fn a_dropped_pool_lets_its_tasks_finish() {
        let pool = EdgePool::new(1, Duration::from_secs(5), None).expect("runtimes");
        let (finish, finished) = tokio::sync::oneshot::channel::<()>();
        let (done_tx, done) = tokio::sync::oneshot::channel();
        pool.spawn(async move {
            let _ = finished.await;
            let _ = done_tx.send(std::thread::current().name().map(str::to_string));
        });
        drop(pool);
        let _ = finish.send(());
        let ran_on = tokio::time::timeout(Duration::from_secs(5), done).await;
        let ran_on = ran_on.expect("in time").expect("sent");
        assert!(ran_on.is_some_and(|n| n.starts_with("ahp-edge-")));
    }

    #[test]
    fn an_edge_runtime_runs_its_tasks_on_its_one_thread() {
        let pool = EdgePool::new(1, Duration::ZERO, None).expect("runtimes");
        let (tx, rx) = std::sync::mpsc::channel();
        pool.spawn(async move {
            let flavor = Handle::current().runtime_flavor();
            let thread = std::thread::current().name().map(str::to_string);
            let _ = tx.send((flavor, thread));
        });
        let (flavor, thread) = rx.recv_timeout(Duration::from_secs(5)).expect("ran");
        assert_eq!(flavor, tokio::runtime::RuntimeFlavor::CurrentThread);
        assert_eq!(thread.as_deref(), Some("ahp-edge-0"));
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn the_pools_threads_ask_for_their_slice_and_others_do_not() {
        let pool =
            EdgePool::new(1, Duration::ZERO, Some(Duration::from_micros(300))).expect("runtimes");
        let plain = EdgePool::new(1, Duration::ZERO, None).expect("runtimes");
        let slice_on = |pool: &EdgePool| {
            let (tx, rx) = tokio::sync::oneshot::channel();
            pool.spawn(async move {
                let _ = tx.send(crate::edge::slice::current_slice_ns());
            });
            rx
        };
        let (sliced, default) = (
            slice_on(&pool).await.expect("ran"),
            slice_on(&plain).await.expect("ran"),
        );
        if !crate::edge::slice::kernel_honours_slices() {
            eprintln!("skipped: this kernel predates custom slices");
            return;
        }
        assert_ne!(
            default,
            Some(300_000),
            "a pool without a slice keeps the kernel's"
        );
        assert_eq!(
            sliced,
            Some(300_000),
            "an edge thread runs with the slice it asked for"
        );
    }

    #[test]
    fn unset_threads_mean_one_per_core() {
        assert_eq!(EdgePool::threads_for(Some(3)), 3);
        assert!(EdgePool::threads_for(None) >= 1);
    }
}
