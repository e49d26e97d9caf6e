//! Per-session access context: the principal, the policy, key resolution, and the
//! decisions made while planning the current query (for the audit log).

use std::sync::{Arc, Mutex};

use clearice_crypto::{AccessToken, KeyResolver, Providers};
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
}

/// What a write did, filled in when it commits: the audit record is written after the
/// statement ends, so it carries the rows written and the snapshot committed.
#[derive(Debug, Clone)]
pub struct WriteAudit(Arc<Mutex<WriteReport>>);

/// The outcome of one write.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteReport {
    /// Audit action: `insert`, `insert_overwrite`, `delete`, `update`, `create_table`,
    /// `create_table_as`, `drop_table`, `create_schema`, `drop_schema`, `alter_table`.
    pub action: String,
    /// The snapshot the write committed (`None` until it commits, or when it wrote none).
    pub snapshot_id: Option<i64>,
    /// Rows written (or removed, for `delete`).
    pub rows: Option<u64>,
}

impl WriteAudit {
    /// A write of kind `action`, not committed yet.
    pub fn new(action: &str) -> Self {
        Self(Arc::new(Mutex::new(WriteReport {
            action: action.to_owned(),
            ..Default::default()
        })))
    }

    /// Records the commit.
    pub fn committed(&self, snapshot_id: Option<i64>, rows: u64) {
        let mut r = self.0.lock().expect("write report");
        r.snapshot_id = snapshot_id;
        r.rows = Some(rows);
    }

    /// The report so far.
    pub fn report(&self) -> WriteReport {
        self.0.lock().expect("write report").clone()
    }
}

impl PartialEq for WriteAudit {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for WriteAudit {}

/// What one query read: its table accesses (merged per table). Queries
/// that run at once in one session each collect their own: [`QueryAccess::scope`] makes
/// a collector current for the task that plans the query, and the session's policy
/// providers record into it.
#[derive(Debug, Default, Clone)]
pub struct QueryAccess(Arc<QueryAccessInner>);

#[derive(Debug, Default)]
struct QueryAccessInner {
    accesses: Mutex<Vec<TableAccess>>,
}

tokio::task_local! {
    static CURRENT_QUERY: QueryAccess;
}

impl QueryAccess {
    /// Runs `f` (the planning of one query) with this collector current.
    pub async fn scope<F: Future>(&self, f: F) -> F::Output {
        CURRENT_QUERY.scope(self.clone(), f).await
    }

    /// Takes the accesses recorded so far.
    pub fn take(&self) -> Vec<TableAccess> {
        std::mem::take(&mut *self.0.accesses.lock().expect("accesses"))
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
        } else {
            all.push(access);
        }
    }

    /// The collector of the query being planned on this task, else `fallback`.
    fn current_or(fallback: &QueryAccess) -> QueryAccess {
        CURRENT_QUERY
            .try_with(QueryAccess::clone)
            .unwrap_or_else(|_| fallback.clone())
    }
}

/// What a session knows about who is asking.
#[derive(Debug)]
pub struct SessionAccess {
    principal: String,
    policy: Arc<Policy>,
    resolver: Arc<KeyResolver>,
    providers: Arc<Providers>,
    credential: Option<AccessToken>,
    /// Records made outside any [`QueryAccess::scope`].
    unscoped: QueryAccess,
}

impl SessionAccess {
    /// Access context for `principal`.
    pub fn new(
        principal: impl Into<String>,
        policy: Arc<Policy>,
        resolver: Arc<KeyResolver>,
        providers: Arc<Providers>,
    ) -> Self {
        Self {
            principal: principal.into(),
            policy,
            resolver,
            providers,
            credential: None,
            unscoped: QueryAccess::default(),
        }
    }

    /// With the principal's own token for crypto providers (a Flight client's
    /// `key_access_token`).
    pub fn with_credential(mut self, credential: Option<AccessToken>) -> Self {
        self.credential = credential;
        self
    }

    /// The crypto providers.
    pub fn providers(&self) -> &Arc<Providers> {
        &self.providers
    }

    /// The principal's own provider token, if the client passed one.
    pub fn credential(&self) -> Option<&AccessToken> {
        self.credential.as_ref()
    }

    /// The principal.
    pub fn principal(&self) -> &str {
        &self.principal
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
