//! Cancellation: running result streams registered under their query id, with their
//! owner, so that `CancelFlightInfo` can abort them (dropping a stream cancels its query).
//!
//! Threat model: tickets travel in the clear inside every FlightInfo and anyone can build
//! one, so a ticket must not be guessable from what it runs, and knowing one must not
//! let another user stop the query.
//! - Every ticket of a query (`TicketStatementQuery`, and the ticket of a prepared
//!   statement's FlightInfo) starts with a [`QueryId`]: 128 random bits, hex, drawn when
//!   the FlightInfo is made. A ticket built from SQL text alone (or a prepared handle
//!   alone) has none and is refused by `DoGet`.
//! - A running stream is registered under its query id with its [`Owner`]: the principal
//!   and the SHA-256 of the bearer token of the `DoGet` that started it. Only a
//!   `CancelFlightInfo` of the same principal and token (the same Flight session)
//!   cancels it; anyone else gets `NOT_CANCELLABLE`, the answer for an unknown ticket,
//!   so a cancel does not reveal that a query runs.
//! - A cancelled stream ends with the gRPC status `CANCELLED`, never as a clean end of
//!   stream: a client must not take a cut-off result for a complete one.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use arrow_flight::error::FlightError;
use futures::Stream;
use futures::stream::{AbortHandle, Abortable};
use sha2::{Digest, Sha256};

/// What a cancelled stream ends with.
const CANCELLED: &str = "query cancelled by CancelFlightInfo";

/// Hex digits of a [`QueryId`] (128 bits).
const ID_HEX: usize = 32;

/// The random id of one issued query ticket (128 bits, lowercase hex).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct QueryId(String);

impl QueryId {
    /// A new random id.
    pub(crate) fn random() -> Self {
        Self(hex::encode(rand::random::<[u8; 16]>()))
    }

    /// `<id>:<body>`: the handle of a ticket for `body` (SQL text or a prepared handle).
    pub(crate) fn handle(&self, body: &[u8]) -> prost::bytes::Bytes {
        let mut out = Vec::with_capacity(ID_HEX + 1 + body.len());
        out.extend_from_slice(self.0.as_bytes());
        out.push(b':');
        out.extend_from_slice(body);
        out.into()
    }

    /// The id and body of a handle made by [`Self::handle`]; `None` for anything else
    /// (a handle forged from SQL text alone).
    pub(crate) fn split(handle: &[u8]) -> Option<(Self, &[u8])> {
        let (id, rest) = handle.split_at_checked(ID_HEX)?;
        let body = rest.strip_prefix(b":")?;
        let lower_hex = |b: &u8| b.is_ascii_digit() || (b'a'..=b'f').contains(b);
        if !id.iter().all(lower_hex) {
            return None;
        }
        let id = std::str::from_utf8(id).ok()?.to_owned();
        Some((Self(id), body))
    }
}

/// Who started a stream: its principal and the SHA-256 of its bearer token (`None` for
/// a call with `Basic` credentials).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Owner {
    principal: String,
    token: Option<[u8; 32]>,
}

impl Owner {
    /// The owner of a call by `principal` with bearer `token` (the token is kept only as
    /// its digest).
    pub(crate) fn new(principal: &str, token: Option<&str>) -> Self {
        Self {
            principal: principal.to_owned(),
            token: token.map(|t| Sha256::digest(t.as_bytes()).into()),
        }
    }
}

struct Entry {
    serial: u64,
    owner: Owner,
    abort: AbortHandle,
}

/// Abort handles of running results, by query id.
#[derive(Clone, Default)]
pub(crate) struct Running {
    by_id: Arc<Mutex<HashMap<QueryId, Vec<Entry>>>>,
    serials: Arc<AtomicU64>,
}

impl Running {
    fn lock(&self) -> MutexGuard<'_, HashMap<QueryId, Vec<Entry>>> {
        // A panic while holding the lock leaves the map consistent (every change is one
        // insert or remove): keep using it.
        self.by_id.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers `stream` under `id` for `owner`: the returned stream is `stream` until
    /// [`Self::cancel`] aborts it, then ends with `CANCELLED`. It unregisters itself
    /// when it ends or is dropped.
    pub(crate) fn register<S>(&self, id: QueryId, owner: Owner, stream: S) -> Cancellable<S> {
        let (abort, registration) = AbortHandle::new_pair();
        let serial = self.serials.fetch_add(1, Ordering::Relaxed);
        self.lock().entry(id.clone()).or_default().push(Entry {
            serial,
            owner,
            abort,
        });
        Cancellable {
            inner: Abortable::new(stream, registration),
            done: false,
            _registered: Unregister {
                running: self.clone(),
                id,
                serial,
            },
        }
    }

    /// Aborts the streams of `id` that `owner` started; whether there were any.
    pub(crate) fn cancel(&self, id: &QueryId, owner: &Owner) -> bool {
        let mut all = self.lock();
        let Some(entries) = all.get_mut(id) else {
            return false;
        };
        let mut cancelled = false;
        entries.retain(|e| {
            if e.owner == *owner {
                e.abort.abort();
                cancelled = true;
                false
            } else {
                true
            }
        });
        if entries.is_empty() {
            all.remove(id);
        }
        cancelled
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().values().map(Vec::len).sum()
    }
}

/// Removes a result's cancel handle when its stream ends or is dropped.
struct Unregister {
    running: Running,
    id: QueryId,
    serial: u64,
}

impl Drop for Unregister {
    fn drop(&mut self) {
        let mut all = self.running.lock();
        if let Some(entries) = all.get_mut(&self.id) {
            entries.retain(|e| e.serial != self.serial);
            if entries.is_empty() {
                all.remove(&self.id);
            }
        }
    }
}

/// A registered result stream (see [`Running::register`]).
pub(crate) struct Cancellable<S> {
    inner: Abortable<S>,
    done: bool,
    _registered: Unregister,
}

impl<S, T> Stream for Cancellable<S>
where
    S: Stream<Item = Result<T, FlightError>> + Unpin,
{
    type Item = Result<T, FlightError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_next(cx) {
            Poll::Ready(None) => {
                self.done = true;
                if self.inner.is_aborted() {
                    let status = tonic::Status::cancelled(CANCELLED);
                    Poll::Ready(Some(Err(FlightError::Tonic(Box::new(status)))))
                } else {
                    Poll::Ready(None)
                }
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    fn endless() -> impl Stream<Item = Result<u32, FlightError>> + Unpin {
        futures::stream::repeat_with(|| Ok(1))
    }

    #[test]
    fn handles_round_trip_and_sql_alone_is_no_handle() {
        let id = QueryId::random();
        let handle = id.handle(b"SELECT 1");
        assert_eq!(QueryId::split(&handle), Some((id, &b"SELECT 1"[..])));
        assert_eq!(QueryId::split(b"SELECT 1"), None);
        assert_eq!(
            QueryId::split(b"SELECT 1 FROM t WHERE a = 'x' AND b = :p"),
            None
        );
        assert_eq!(QueryId::split(&[b'A'; 40]), None);
    }

    #[tokio::test]
    async fn only_the_owner_cancels_and_the_stream_ends_cancelled() {
        let running = Running::default();
        let id = QueryId::random();
        let owner = Owner::new("ann", Some("t1"));
        let mut s = running.register(id.clone(), owner.clone(), endless());
        assert!(s.next().await.is_some());
        assert!(!running.cancel(&id, &Owner::new("eve", Some("t1"))));
        assert!(!running.cancel(&id, &Owner::new("ann", Some("t2"))));
        assert!(!running.cancel(&id, &Owner::new("ann", None)));
        assert!(!running.cancel(&QueryId::random(), &owner));
        assert!(matches!(s.next().await, Some(Ok(1))));
        assert!(running.cancel(&id, &owner));
        match s.next().await {
            Some(Err(FlightError::Tonic(st))) => assert_eq!(st.code(), tonic::Code::Cancelled),
            other => panic!("expected CANCELLED, got {other:?}"),
        }
        assert!(s.next().await.is_none());
        assert!(!running.cancel(&id, &owner), "nothing left to cancel");
    }

    #[tokio::test]
    async fn a_stream_that_ends_unregisters_only_itself() {
        let running = Running::default();
        let id = QueryId::random();
        let owner = Owner::new("ann", None);
        let mut done = running.register(
            id.clone(),
            owner.clone(),
            futures::stream::empty::<Result<u32, FlightError>>(),
        );
        let _other = running.register(id.clone(), owner.clone(), endless());
        assert_eq!(running.len(), 2);
        assert!(
            done.next().await.is_none(),
            "a finished stream ends cleanly"
        );
        drop(done);
        assert_eq!(running.len(), 1);
        assert!(running.cancel(&id, &owner));
        assert_eq!(running.len(), 0);
    }
}
