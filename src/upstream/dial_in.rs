//! Hosts that dial in (contract §13): the relay cannot reach such a host,
//! so its connector (`ahp-relay connect`, next to the host) keeps one
//! control connection to the relay, and for every WebSocket the relay
//! wants to the host — the watch link, each per-client link — the relay
//! asks over that connection and the connector opens one more WebSocket to
//! the relay (and one to the host) and passes frames both ways unchanged.
//!
//! This module is the relay's side of the asking, independent of sockets:
//! [`Connectors`] holds, per host id, the one attached connector (its
//! orders queue and the links it still owes). [`HostHub::dial`] asks it
//! with [`Connectors::request`] and gets the inbound socket the edge hands
//! over with [`Connectors::claim`]; what comes back is a [`HostSocket`],
//! the one type every link reads and writes, dialed or dialed in. Nothing
//! else in `upstream` knows how a host was reached.
//!
//! [`HostHub::dial`]: super::hub::HostHub::dial

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, mpsc, oneshot};

pub use super::frames::{FrameLimits, HostIo, HostSocket};

/// The path of the connector endpoint on the client listener. A request
/// there is authenticated by a host's dial-in token, never by a client
/// JWT; no other path accepts a host token.
pub const CONNECTOR_PATH: &str = "/ahp-relay/connector";
/// Request header naming the host id a connector serves.
pub const HOST_ID_HEADER: &str = "ahp-relay-host";
/// Request header of a link socket: the link the relay asked for. A
/// request without it is the connector's control connection.
pub const LINK_HEADER: &str = "ahp-relay-link";

/// A message on the control connection (JSON text frames, one per message).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Control {
    /// Relay → connector, first: the connector serves `host`.
    Welcome {
        /// The host id.
        host: String,
    },
    /// Relay → connector: open link `link` (dial the host with `headers`,
    /// then the relay's connector path with [`LINK_HEADER`] = `link`).
    Open {
        /// The link number the relay waits for.
        link: u64,
        /// Extra headers for the host's upgrade request (the end user's
        /// issuer and subject on per-client links).
        headers: Vec<(String, String)>,
    },
    /// Connector → relay: link `link` cannot be opened (`reason`, one line,
    /// never a URL or credential).
    Failed {
        /// The link number.
        link: u64,
        /// Why.
        reason: String,
    },
}

/// Why a dial-in host could not be reached. Never names a credential.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DialInError {
    /// No connector was attached for the host within the wait.
    #[error("no connector attached (waited {0:?}): run `ahp-relay connect` next to the host")]
    NoConnector(Duration),
    /// The connector was asked but its socket did not arrive in time.
    #[error("the connector did not open the link within {0:?}")]
    NoSocket(Duration),
    /// The connector reported that it could not open the link.
    #[error("the connector could not open the link: {0}")]
    Failed(String),
    /// The connector went away (or its socket failed) before the link opened.
    #[error("the connector went away before the link opened")]
    Lost,
    /// The connector has too many link requests outstanding.
    #[error("the connector has too many link requests outstanding")]
    Busy,
}

/// The connector a host id has now: why another is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("host {0} already has a connector attached")]
pub struct AlreadyAttached(pub String);

/// Where a link's socket (or the connector's reason for not opening it) goes.
pub type Delivery = oneshot::Sender<Result<HostSocket, String>>;

/// Where a requester waits for its [`Delivery`].
type Awaited = oneshot::Receiver<Result<HostSocket, String>>;

/// Link requests queued towards one connector before more are refused.
const ORDERS: usize = 256;

/// One attached connector.
#[derive(Debug)]
struct Slot {
    generation: u64,
    /// Where it connected from (its client address), for the status page.
    peer: String,
    orders: mpsc::Sender<Control>,
    /// Links asked for and not yet delivered, by link number.
    pending: HashMap<u64, Delivery>,
}

/// The attached connectors, by host id: at most one per host at a time.
#[derive(Debug, Default)]
pub struct Connectors {
    slots: Mutex<HashMap<String, Slot>>,
    /// Signalled whenever a connector attaches.
    arrived: Notify,
    next: AtomicU64,
}

/// A connector's place in [`Connectors`], held by its control connection:
/// orders arrive on [`Attachment::orders`]; dropping it detaches the
/// connector and fails the links it still owes.
#[derive(Debug)]
pub struct Attachment {
    connectors: Arc<Connectors>,
    host: String,
    generation: u64,
    /// Link requests to send over the control connection; ends when the
    /// connector is evicted (its host removed or changed by a reload).
    pub orders: mpsc::Receiver<Control>,
}

impl Attachment {
    /// The host this connector serves.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The connector reported that it cannot open `link`.
    pub fn failed(&self, link: u64, reason: &str) {
        let mut slots = self.connectors.lock();
        let Some(slot) = slots.get_mut(&self.host) else {
            return;
        };
        if slot.generation == self.generation
            && let Some(delivery) = slot.pending.remove(&link)
        {
            let _ = delivery.send(Err(reason.to_string()));
        }
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        let mut slots = self.connectors.lock();
        if slots
            .get(&self.host)
            .is_some_and(|s| s.generation == self.generation)
        {
            slots.remove(&self.host);
        }
    }
}

impl Connectors {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Attaches a connector for `host` from `peer`, unless one is attached
    /// (a second is refused while the first's control connection lives).
    pub fn attach(
        self: &Arc<Self>,
        host: &str,
        peer: String,
    ) -> Result<Attachment, AlreadyAttached> {
        let (tx, rx) = mpsc::channel(ORDERS);
        let generation = self.next.fetch_add(1, Ordering::Relaxed);
        {
            let mut slots = self.lock();
            if slots.contains_key(host) {
                return Err(AlreadyAttached(host.to_string()));
            }
            slots.insert(
                host.to_string(),
                Slot {
                    generation,
                    peer,
                    orders: tx,
                    pending: HashMap::new(),
                },
            );
        }
        self.arrived.notify_waiters();
        Ok(Attachment {
            connectors: self.clone(),
            host: host.to_string(),
            generation,
            orders: rx,
        })
    }

    /// Detaches `host`'s connector (its control connection is closed and
    /// the links it owes fail); a connector may attach again at once.
    pub fn evict(&self, host: &str) {
        self.lock().remove(host);
    }

    /// Completes when a connector attaches (for any host).
    pub fn arrival(&self) -> tokio::sync::futures::Notified<'_> {
        self.arrived.notified()
    }

    /// Which connector `host` has now (a number unique to this attachment).
    pub fn generation(&self, host: &str) -> Option<u64> {
        self.lock().get(host).map(|s| s.generation)
    }

    /// The address `host`'s connector connected from, if one is attached.
    pub fn peer(&self, host: &str) -> Option<String> {
        self.lock().get(host).map(|s| s.peer.clone())
    }

    /// A WebSocket to `host` through its connector: waits up to `wait` for
    /// a connector to attach (one restarting is back within it), asks it
    /// for a link with `headers`, and waits up to `wait` again for the
    /// socket to arrive ([`Connectors::claim`]).
    pub async fn request(
        &self,
        host: &str,
        headers: Vec<(String, String)>,
        wait: Duration,
    ) -> Result<HostSocket, DialInError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let arrived = self.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            if let Some((link, socket)) = self.ask(host, &headers)? {
                return match tokio::time::timeout(wait, socket).await {
                    Ok(Ok(Ok(socket))) => Ok(socket),
                    Ok(Ok(Err(reason))) => Err(DialInError::Failed(reason)),
                    Ok(Err(_)) => Err(DialInError::Lost),
                    Err(_) => {
                        self.forget(host, link);
                        Err(DialInError::NoSocket(wait))
                    }
                };
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return Err(DialInError::NoConnector(wait));
            }
        }
    }

    /// Sends an `open` order to `host`'s connector; `None` if none is attached.
    fn ask(
        &self,
        host: &str,
        headers: &[(String, String)],
    ) -> Result<Option<(u64, Awaited)>, DialInError> {
        let mut slots = self.lock();
        let Some(slot) = slots.get_mut(host) else {
            return Ok(None);
        };
        let link = self.next.fetch_add(1, Ordering::Relaxed);
        let order = Control::Open {
            link,
            headers: headers.to_vec(),
        };
        if slot.orders.try_send(order).is_err() {
            return Err(DialInError::Busy);
        }
        let (tx, rx) = oneshot::channel();
        slot.pending.insert(link, tx);
        Ok(Some((link, rx)))
    }

    fn forget(&self, host: &str, link: u64) {
        if let Some(slot) = self.lock().get_mut(host) {
            slot.pending.remove(&link);
        }
    }

    /// Takes link `link` of `host`'s connector, if the relay is waiting
    /// for it: the socket goes to the returned sender (dropping it fails
    /// the request). `None`: nobody waits for that link.
    pub fn claim(&self, host: &str, link: u64) -> Option<Delivery> {
        self.lock().get_mut(host)?.pending.remove(&link)
    }
}

/// Whether `given` equals `expected`, in time that depends only on their
/// SHA-256 digests' lengths (fixed), not on where they differ.
pub fn same_token(given: &str, expected: &str) -> bool {
    use sha2::{Digest, Sha256};
    let a = Sha256::digest(given.as_bytes());
    let b = Sha256::digest(expected.as_bytes());
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_by_value() {
        assert!(same_token("abc", "abc"));
        assert!(!same_token("abc", "abd"));
        assert!(!same_token("", "abc"));
    }

    #[tokio::test]
    async fn one_connector_per_host_and_requests_fail_without_one() {
        let c = Arc::new(Connectors::default());
        let first = c.attach("h", "1.2.3.4:5".into());
        assert!(first.is_ok());
        assert_eq!(
            c.attach("h", "1.2.3.4:6".into()).err(),
            Some(AlreadyAttached("h".into()))
        );
        assert_eq!(c.peer("h").as_deref(), Some("1.2.3.4:5"));
        drop(first);
        assert!(c.peer("h").is_none());
        let err = c
            .request("h", Vec::new(), Duration::from_millis(20))
            .await
            .err();
        assert_eq!(
            err,
            Some(DialInError::NoConnector(Duration::from_millis(20)))
        );
        assert!(c.attach("h", "1.2.3.4:7".into()).is_ok());
    }

    #[tokio::test]
    async fn a_request_sends_an_order_and_a_failure_ends_it() {
        let c = Arc::new(Connectors::default());
        let Ok(mut att) = c.attach("h", "p".into()) else {
            panic!("attach");
        };
        let asker = {
            let c = c.clone();
            tokio::spawn(async move { c.request("h", Vec::new(), Duration::from_secs(5)).await })
        };
        let Some(Control::Open { link, .. }) = att.orders.recv().await else {
            panic!("no order");
        };
        att.failed(link, "host refused");
        let got = asker.await.map(|r| r.err());
        assert_eq!(
            got.ok().flatten(),
            Some(DialInError::Failed("host refused".into()))
        );
        assert!(c.claim("h", link).is_none());
    }
}
