//! A signed scan lives as long as its query: the coordinator signs each scan for one
//! attempt of one query, and tells the workers when that attempt ends; a worker refuses a
//! scan of a query that ended (a recorded stage plan replayed), before any work.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::time::Duration;

use parking_lot::Mutex;
use uuid::Uuid;

use crate::signer::{CALL_WINDOW, now_s};

/// The worker RPC by which a coordinator ends a query (authenticated like every call):
/// server-streaming, the query in [`QUERY_HEADER`], no message either way; the answer is
/// its status.
pub const END_QUERY: &str = "/clearice.cluster.v1.Cluster/EndQuery";

/// The header of [`END_QUERY`] naming the query that ended (a UUID).
pub const QUERY_HEADER: &str = "x-clearice-query";

/// The query a call's [`QUERY_HEADER`] names, if it names one.
pub(crate) fn query_in(headers: &tonic::codegen::http::HeaderMap) -> Option<Uuid> {
    headers
        .get(QUERY_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| Uuid::parse_str(v).ok())
}

thread_local! {
    /// The query whose scans are being encoded on this thread (see [`encoding_for`]).
    static ENCODING_FOR: Cell<Option<Uuid>> = const { Cell::new(None) };
}

/// Runs `f` with the scans it encodes signed for query `query`. datafusion-distributed
/// encodes every stage plan synchronously when its root starts executing, so the
/// coordinator's root wraps that call in this; a scan encoded outside any query is not
/// sent.
pub fn encoding_for<T>(query: Uuid, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<Uuid>);
    impl Drop for Restore {
        fn drop(&mut self) {
            ENCODING_FOR.set(self.0);
        }
    }
    let _restore = Restore(ENCODING_FOR.replace(Some(query)));
    f()
}

/// The query scans are encoded for on this thread, if any.
pub(crate) fn encoding_query() -> Option<Uuid> {
    ENCODING_FOR.get()
}

/// Most ended queries a worker remembers; past it, those that ended first are forgotten
/// first (their scans then stay valid until they expire, as without this list).
const MAX_ENDED: usize = 262_144;

/// The queries coordinators said ended, each kept until its scans expire anyway
/// (`task_ttl_s` after it ended, since every one was signed before, plus the clock skew a
/// call credential tolerates).
pub(crate) struct EndedQueries {
    ttl: Duration,
    ended: Mutex<Ended>,
}

impl fmt::Debug for EndedQueries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EndedQueries")
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct Ended {
    /// Query → when it can be forgotten (unix s).
    until: HashMap<Uuid, u64>,
    /// The same, in the order they ended (so in the order they can be forgotten).
    order: VecDeque<(u64, Uuid)>,
}

impl EndedQueries {
    /// An empty list whose entries are kept `ttl` (the cluster's `task_ttl_s`).
    pub(crate) fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            ended: Mutex::default(),
        }
    }

    /// Records that `query` ended.
    pub(crate) fn end(&self, query: Uuid) {
        let now = now_s();
        let mut ended = self.ended.lock();
        let Ended { until, order } = &mut *ended;
        while let Some(&(at, first)) = order.front() {
            if at >= now && order.len() < MAX_ENDED {
                break;
            }
            order.pop_front();
            if until.get(&first) == Some(&at) {
                until.remove(&first);
            }
        }
        let at = now
            .saturating_add(self.ttl.as_secs())
            .saturating_add(CALL_WINDOW.as_secs());
        until.insert(query, at);
        order.push_back((at, query));
    }

    /// Whether `query` ended (and is still remembered).
    pub(crate) fn has_ended(&self, query: &Uuid) -> bool {
        self.ended
            .lock()
            .until
            .get(query)
            .is_some_and(|until| *until >= now_s())
    }

    /// `Ok` while `query` runs; once it ended, the refusal of its scan of `table`.
    pub(crate) fn admit(&self, query: &Uuid, table: &str) -> datafusion::error::Result<()> {
        if self.has_ended(query) {
            return Err(crate::error::refused(format!(
                "table {table}: its query ended (a stage plan is valid only while its query runs)"
            )));
        }
        Ok(())
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.ended.lock().until.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ended_queries_are_remembered_bounded_and_scoped_per_thread() {
        let ended = EndedQueries::new(Duration::from_secs(60));
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        ended.end(a);
        assert!(ended.has_ended(&a) && !ended.has_ended(&b));
        for _ in 0..MAX_ENDED + 10 {
            ended.end(Uuid::new_v4());
        }
        assert_eq!(ended.len(), MAX_ENDED);
        // Nothing expired: the first ended are forgotten first.
        assert!(!ended.has_ended(&a));
        assert_eq!(encoding_query(), None);
        let inner = encoding_for(a, || {
            assert_eq!(encoding_query(), Some(a));
            encoding_for(b, encoding_query)
        });
        assert_eq!(inner, Some(b));
        assert_eq!(encoding_query(), None);
    }
}
