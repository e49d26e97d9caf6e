//! Per-session access context: the principal, the policy, key resolution, and the
//! decisions made while planning the current query (for the audit log).

use std::sync::{Arc, Mutex};

use clearice_crypto::{AccessToken, KeyResolver, MaskKey, Providers};
use clearice_iceberg::WriteAudit;

use crate::caller::Caller;
use clearice_policy::{AuditColumn, Policy};

/// One table as accessed by the current query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableAccess {
    /// `catalog.namespace.table`.
    pub table: String,
    /// The snapshot read (`None` before a snapshot was chosen, or for an empty table).
    pub snapshot_id: Option<i64>,
    /// Columns used, with decisions.
    pub columns: Vec<AuditColumn>,
    /// Whether access was allowed.
    pub allowed: bool,
    /// Denial message.
    pub error: Option<String>,
    /// Set when the statement writes the table (or creates or drops it).
    pub write: Option<WriteAudit>,
    /// The row filter the read was under (its rule and predicate), if any.
    pub row_filter: Option<String>,
}

/// What one query read: its table accesses (merged per table). Queries
/// that run at once in one session each collect their own: [`QueryAccess::scope`] makes
/// a collector current for the task that plans the query, and the session's policy
/// providers record into it.
#[derive(Debug, Default, Clone)]
pub struct QueryAccess(Arc<QueryAccessInner>);

#[derive(Debug, Default)]
struct QueryAccessInner {
    /// When the statement is cancelled (its `statement_timeout_s`), if it has a timeout.
    deadline: Option<Deadline>,
    accesses: Mutex<Vec<TableAccess>>,
    /// What happened while it ran that its audit records report (a retry on other
    /// cluster workers), one line each.
    notes: Mutex<Vec<String>>,
    /// When the statement started, and its gauge of running statements (a statement that
    /// runs: [`QueryAccess::until`]; its collector lives as long as its result stream).
    started: Option<(std::time::Instant, clearice_metrics::Running)>,
    /// The statement's kind (`select`, `insert`, ...), once it is parsed.
    kind: std::sync::OnceLock<&'static str>,
}

tokio::task_local! {
    static CURRENT_QUERY: QueryAccess;
}

/// When a statement is cancelled, and the timeout it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    /// The instant it is cancelled at.
    pub at: std::time::Instant,
    /// Its timeout (`[server.limits] statement_timeout_s`).
    pub limit: std::time::Duration,
}

impl QueryAccess {
    /// The collector of a statement that is cancelled `limit` from now, if it has a
    /// timeout (its plan nodes that run elsewhere, cluster workers, are told).
    pub fn until(limit: Option<std::time::Duration>) -> Self {
        let now = std::time::Instant::now();
        Self(Arc::new(QueryAccessInner {
            deadline: limit.map(|limit| Deadline {
                at: now + limit,
                limit,
            }),
            started: Some((now, clearice_metrics::statement_started())),
            ..Default::default()
        }))
    }

    /// How long ago the statement started (zero for a collector made with `default`).
    pub fn elapsed(&self) -> std::time::Duration {
        self.0
            .started
            .as_ref()
            .map_or(std::time::Duration::ZERO, |(at, _)| at.elapsed())
    }

    /// Names the statement's kind (the first name given stays).
    pub fn set_kind(&self, kind: &'static str) {
        let _ = self.0.kind.set(kind);
    }

    /// The statement's kind; `unparsed` if it never was.
    pub fn kind(&self) -> &'static str {
        self.0.kind.get().copied().unwrap_or("unparsed")
    }

    /// When the statement is cancelled, if it has a timeout.
    pub fn deadline(&self) -> Option<Deadline> {
        self.0.deadline
    }

    /// Runs `f` (the planning of one query) with this collector current.
    pub async fn scope<F: Future>(&self, f: F) -> F::Output {
        CURRENT_QUERY.scope(self.clone(), f).await
    }

    /// Takes the accesses recorded so far.
    pub fn take(&self) -> Vec<TableAccess> {
        std::mem::take(&mut *self.0.accesses.lock().expect("accesses"))
    }

    /// The collector of the query being planned on this task, if any (for plan nodes
    /// that [`note`](Self::note) what happens while the query runs).
    pub fn current() -> Option<QueryAccess> {
        CURRENT_QUERY.try_with(QueryAccess::clone).ok()
    }

    /// Notes an event of the running query for its audit records (one line: no values,
    /// no key material).
    pub fn note(&self, line: String) {
        self.0.notes.lock().expect("notes").push(line);
    }

    /// The events noted so far.
    pub fn notes(&self) -> Vec<String> {
        self.0.notes.lock().expect("notes").clone()
    }

    fn record(&self, access: TableAccess) {
        let mut all = self.0.accesses.lock().expect("accesses");
        if let Some(prev) = all.iter_mut().find(|a| {
            a.table == access.table
                && a.snapshot_id == access.snapshot_id
                && a.write == access.write
        }) {
            for c in access.columns {
                if !prev.columns.iter().any(|p| p.name == c.name) {
                    prev.columns.push(c);
                }
            }
            prev.allowed &= access.allowed;
            if prev.error.is_none() {
                prev.error = access.error;
            }
            if prev.row_filter.is_none() {
                prev.row_filter = access.row_filter;
            }
        } else {
            all.push(access);
        }
    }

    /// The collector of the query being planned on this task, else `fallback`.
    fn current_or(fallback: &QueryAccess) -> QueryAccess {
        Self::current().unwrap_or_else(|| fallback.clone())
    }
}

/// What a session knows about who is asking: the [`Caller`], and the policy and keys
/// its decisions are made with.
#[derive(Debug)]
pub struct SessionAccess {
    caller: Caller,
    policy: Arc<Policy>,
    resolver: Arc<KeyResolver>,
    providers: Arc<Providers>,
    /// The `hmac_sha256` mask's secret, if the policy has one.
    mask_key: Option<Arc<MaskKey>>,
    /// Records made outside any [`QueryAccess::scope`].
    unscoped: QueryAccess,
}

impl SessionAccess {
    /// Access context for `caller`.
    pub fn new(
        caller: Caller,
        policy: Arc<Policy>,
        resolver: Arc<KeyResolver>,
        providers: Arc<Providers>,
    ) -> Self {
        Self {
            caller,
            policy,
            resolver,
            providers,
            mask_key: None,
            unscoped: QueryAccess::default(),
        }
    }

    /// With the `hmac_sha256` mask's secret (the policy's `[masks] hmac_key_file`).
    pub fn with_mask_key(mut self, key: Option<Arc<MaskKey>>) -> Self {
        self.mask_key = key;
        self
    }

    /// The `hmac_sha256` mask's secret, if loaded.
    pub fn mask_key(&self) -> Option<&Arc<MaskKey>> {
        self.mask_key.as_ref()
    }

    /// Who is asking.
    pub fn caller(&self) -> &Caller {
        &self.caller
    }

    /// The crypto providers.
    pub fn providers(&self) -> &Arc<Providers> {
        &self.providers
    }

    /// The principal's own provider token, if the client passed one.
    pub fn credential(&self) -> Option<&AccessToken> {
        self.caller.credential()
    }

    /// The principal.
    pub fn principal(&self) -> &str {
        self.caller.principal()
    }

    /// The policy.
    pub fn policy(&self) -> &Arc<Policy> {
        &self.policy
    }

    /// Key resolution.
    pub fn resolver(&self) -> &Arc<KeyResolver> {
        &self.resolver
    }

    /// Records a table access of the current query (merged per table).
    pub fn record(&self, access: TableAccess) {
        QueryAccess::current_or(&self.unscoped).record(access);
    }

    /// Takes the accesses recorded outside any query scope since the last call.
    pub fn take(&self) -> Vec<TableAccess> {
        self.unscoped.take()
    }
}
