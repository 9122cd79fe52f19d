//! Keeps a [`super::PgStore`]'s mirror following the table across replicas.
//!
//! A task on the store's runtime holds one connection that `LISTEN`s on
//! [`CHANNEL`] and forwards each announced URI, and each (re)connection and
//! loss, to a thread that applies them: it reads the announced rows again
//! (a batch at a time) and, after every (re)connection, the whole table —
//! what changed while nobody listened is then read too. Each read and its
//! application to the mirror happen under the store's writer lock, so a
//! row read before a local write commits never lands after it. The applying
//! thread waits on the store's runtime like any caller of the store.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

use futures_util::StreamExt;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{AsyncMessage, NoTls, Socket};

use super::schema::CHANNEL;
use super::{Inner, StoreError, Tls};

/// How long the listener waits before connecting again, at most.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// URIs read again per query.
const BATCH: usize = 1000;

/// What the listening connection reports.
enum Event {
    /// `LISTEN` is in force: reload everything, then follow.
    Connected,
    /// The connection is gone; announcements may be missed until the next
    /// [`Event::Connected`].
    Lost,
    /// This URI's row changed.
    Changed(String),
}

/// Starts the listener task and the applying thread.
pub(super) fn start(inner: Arc<Inner>) -> Result<(), StoreError> {
    let (tx, rx) = std::sync::mpsc::channel();
    inner
        .handle
        .spawn(listen(inner.config.clone(), inner.tls.clone(), tx));
    std::thread::Builder::new()
        .name("ahp-store-follow".into())
        .spawn(move || apply_events(&inner, &rx))
        .map(drop)
        .map_err(|e| StoreError::Unavailable(format!("store follower thread: {e}")))
}

/// Connects, listens until the connection ends, reports the loss, waits,
/// and connects again; ends when the applying thread is gone.
async fn listen(config: tokio_postgres::Config, tls: Tls, tx: Sender<Event>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let ended = match &tls {
            Tls::Off => listen_once(&config, NoTls, &tx).await,
            Tls::Rustls(connector) => listen_once(&config, connector.clone(), &tx).await,
        };
        if let Err(e) = ended {
            tracing::warn!(error = %e, "URI store: listening connection lost; reconnecting");
        } else {
            backoff = Duration::from_millis(100);
        }
        if tx.send(Event::Lost).is_err() {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// One listening connection, until it ends.
async fn listen_once<T>(
    config: &tokio_postgres::Config,
    tls: T,
    tx: &Sender<Event>,
) -> Result<(), tokio_postgres::Error>
where
    T: MakeTlsConnect<Socket>,
    T::Stream: Send + 'static,
{
    let (client, mut connection) = config.connect(tls).await?;
    let forward = tx.clone();
    // Polls the connection (which also carries the LISTEN below) and
    // forwards announcements; ends when the connection does.
    let pump = async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    if forward
                        .send(Event::Changed(n.payload().to_owned()))
                        .is_err()
                    {
                        return Ok(());
                    }
                }
                Ok(_) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    };
    let listening = async {
        client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
        let _ = tx.send(Event::Connected);
        std::future::pending::<Result<(), tokio_postgres::Error>>().await
    };
    tokio::select! {
        ended = pump => ended,
        ended = listening => ended,
    }
}

/// Applies events until the listener is gone or the store dropped. A failed
/// read leaves the mirror unfollowed (`health` reports it) and is retried
/// as a whole reload every second.
fn apply_events(inner: &Inner, rx: &Receiver<Event>) {
    let mut reload = false;
    loop {
        if inner.stopped.load(Ordering::Relaxed) {
            return;
        }
        let first = match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(event) => Some(event),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let mut changed = BTreeSet::new();
        for event in first.into_iter().chain(rx.try_iter().take(BATCH)) {
            match event {
                Event::Connected => reload = true,
                Event::Lost => {
                    inner.following.store(false, Ordering::Relaxed);
                    reload = false;
                }
                Event::Changed(uri) => {
                    changed.insert(uri);
                }
            }
        }
        if reload {
            // A reload reads every row, the changed ones included.
            reload = inner.reload().is_err();
            inner.following.store(!reload, Ordering::Relaxed);
            if !reload {
                tracing::info!(entries = inner.entries(), "URI store: following the table");
            }
        } else if !changed.is_empty() && inner.refresh(changed.into_iter().collect()).is_err() {
            inner.following.store(false, Ordering::Relaxed);
            reload = true;
        }
    }
}
