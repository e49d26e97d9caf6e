//! A query's audit records: pending while it runs, written with its outcome (also when its stream ends or is dropped).

use super::*;

impl Session {
    pub(super) async fn write_audit(
        &self,
        id: &str,
        sql: &str,
        query: &QueryAccess,
        result: &Result<QueryOutput>,
    ) -> Result<()> {
        let (outcome, event) = match result {
            Ok(o) => {
                let bytes = o.batches.iter().map(returned_bytes).sum::<u64>();
                clearice_metrics::returned(
                    self.access.caller().principal(),
                    o.rows() as u64,
                    bytes,
                );
                (Ok(o.rows() as u64), None)
            }
            Err(e) => (Err(one_line(e)), event_of(e)),
        };
        let pending = self.pending_audit(id, sql, query.take()).noting(query);
        pending
            .write(outcome, event)
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))
    }

    pub(super) fn pending_audit(
        &self,
        id: &str,
        sql: &str,
        accesses: Vec<clearice_access::TableAccess>,
    ) -> PendingAudit {
        PendingAudit {
            accesses,
            log: self.audit.clone(),
            caller: self.access.caller().clone(),
            query_id: id.to_owned(),
            sql_sha256: hex::encode(Sha256::digest(sql.as_bytes())),
            query: None,
        }
    }
}

/// Audit records of one query, written when its outcome is known.
pub(super) struct PendingAudit {
    accesses: Vec<clearice_access::TableAccess>,
    log: Option<Arc<AuditLog>>,
    caller: Caller,
    query_id: String,
    sql_sha256: String,
    /// The running query's collector: its notes (retries) go into the records.
    query: Option<QueryAccess>,
}

impl PendingAudit {
    /// These records, reporting what `query` notes while it runs.
    pub(super) fn noting(mut self, query: &QueryAccess) -> Self {
        self.query = Some(query.clone());
        self
    }

    /// The records of the query's table accesses, and one of its refusal or limit
    /// (`event`: action and resource) if it was stopped by one.
    fn records(
        self,
        outcome: std::result::Result<u64, String>,
        event: Option<(String, String)>,
    ) -> Vec<AuditRecord> {
        let mut out = Vec::with_capacity(self.accesses.len() + 1);
        let time = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        // Errors are kept without the values they may quote: only names the records
        // carry stay quoted.
        let known: std::collections::BTreeSet<String> = self
            .accesses
            .iter()
            .flat_map(|a| {
                std::iter::once(a.table.clone()).chain(a.columns.iter().map(|c| c.name.clone()))
            })
            .chain([self.caller.principal().to_owned()])
            .collect();
        let known: std::collections::BTreeSet<&str> = known.iter().map(String::as_str).collect();
        let redact = |e: &String| clearice_access::redact::redact_values(e, &known);
        let outcome = outcome.map_err(|e| redact(&e));
        // Engine-made lines: configured worker URLs and the transport's reason, no data
        // (not redacted: the URL says which worker was lost).
        let retries = self
            .query
            .as_ref()
            .map(QueryAccess::notes)
            .unwrap_or_default();
        if let Some((action, resource)) = event {
            out.push(AuditRecord {
                row_filter: None,
                time: time.clone(),
                user: self.caller.principal().to_owned(),
                client: self.caller.client().to_owned(),
                action,
                query_id: self.query_id.clone(),
                sql_sha256: self.sql_sha256.clone(),
                table: resource,
                snapshot_id: None,
                columns: vec![],
                allowed: false,
                rows: None,
                error: outcome.as_ref().err().cloned(),
                retries: retries.clone(),
            });
        }
        for a in self.accesses {
            // A write reports what it committed (rows written, the new snapshot).
            let report = a.write.as_ref().map(clearice_iceberg::WriteAudit::report);
            let (action, snapshot_id, rows) = match report {
                Some(r) => (r.action, r.snapshot_id, outcome.as_ref().ok().and(r.rows)),
                None => (
                    "query".to_owned(),
                    a.snapshot_id,
                    outcome.as_ref().ok().copied(),
                ),
            };
            out.push(AuditRecord {
                row_filter: a.row_filter,
                time: time.clone(),
                user: self.caller.principal().to_owned(),
                client: self.caller.client().to_owned(),
                action,
                query_id: self.query_id.clone(),
                sql_sha256: self.sql_sha256.clone(),
                table: a.table,
                snapshot_id,
                columns: a.columns,
                allowed: a.allowed,
                rows,
                // A refusal keeps its own reason; other tables get the query's error.
                error: a
                    .error
                    .as_ref()
                    .map(redact)
                    .or_else(|| outcome.as_ref().err().cloned()),
                retries: retries.clone(),
            });
        }
        out
    }

    /// Counts the statement's end in the process's metrics: by principal, kind and
    /// outcome (a refusal or a limit by its audit event, or a table the policy denied).
    pub(super) fn count(
        &self,
        outcome: &std::result::Result<u64, String>,
        event: Option<&(String, String)>,
        cancelled: bool,
    ) {
        use clearice_metrics::Outcome;
        let outcome = match (outcome, event) {
            (Ok(_), _) => Outcome::Ok,
            _ if cancelled => Outcome::Cancelled,
            (Err(_), Some((action, _))) if action == "limit" => Outcome::Limited,
            (Err(_), Some(_)) => Outcome::Denied,
            (Err(_), None) if self.accesses.iter().any(|a| !a.allowed) => Outcome::Denied,
            (Err(_), None) => Outcome::Error,
        };
        let (kind, elapsed) = self
            .query
            .as_ref()
            .map_or(("unparsed", std::time::Duration::ZERO), |q| {
                (q.kind(), q.elapsed())
            });
        clearice_metrics::statement_ended(self.caller.principal(), kind, outcome, elapsed);
    }

    /// Writes the records and waits for the audit writer to confirm them.
    pub(super) async fn write(
        mut self,
        outcome: std::result::Result<u64, String>,
        event: Option<(String, String)>,
    ) -> std::result::Result<(), crate::audit::AuditError> {
        self.count(&outcome, event.as_ref(), false);
        let Some(log) = self.log.take() else {
            return Ok(());
        };
        log.write_all(&self.records(outcome, event)).await
    }
}

/// A result stream that writes its query's audit records when it ends: at the end (or
/// the first error) it waits for the audit writer before passing the end (or error) on;
/// dropped early, it hands the records over without waiting.
pub(super) struct AuditedStream {
    inner: SendableRecordBatchStream,
    rows: u64,
    pending: Option<PendingAudit>,
    /// The audit write under way, and the item to pass on once it is done.
    writing: Option<(
        futures::future::BoxFuture<'static, ()>,
        Option<Result<RecordBatch>>,
    )>,
}

impl AuditedStream {
    pub(super) fn new(inner: SendableRecordBatchStream, pending: PendingAudit) -> Self {
        Self {
            inner,
            rows: 0,
            pending: Some(pending),
            writing: None,
        }
    }

    /// Starts writing the audit records (if not written yet); `then` is passed on after.
    fn finish(
        &mut self,
        outcome: std::result::Result<u64, String>,
        event: Option<(String, String)>,
        then: Option<Result<RecordBatch>>,
    ) -> Option<Result<RecordBatch>> {
        let Some(p) = self.pending.take() else {
            return then;
        };
        let write = async move {
            if let Err(e) = p.write(outcome, event).await {
                tracing::error!(error = %e, "audit record not written");
            }
        };
        self.writing = Some((Box::pin(write), then));
        None
    }
}

impl futures::Stream for AuditedStream {
    type Item = Result<RecordBatch>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        loop {
            if let Some((write, _)) = &mut self.writing {
                futures::ready!(write.as_mut().poll(cx));
                let (_, then) = self.writing.take().expect("write under way");
                return Poll::Ready(then);
            }
            // A panic inside DataFusion while producing a batch ends the stream with an
            // error (audited), not the connection or the process.
            let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.inner.as_mut().poll_next(cx)
            }))
            .unwrap_or_else(|p| Poll::Ready(Some(Err(panic_error(p.as_ref())))));
            let item = match futures::ready!(polled) {
                Some(Ok(b)) => {
                    self.rows += b.num_rows() as u64;
                    if let Some(p) = &self.pending {
                        clearice_metrics::returned(
                            p.caller.principal(),
                            b.num_rows() as u64,
                            returned_bytes(&b),
                        );
                    }
                    return Poll::Ready(Some(Ok(b)));
                }
                Some(Err(e)) => {
                    let (msg, event) = (one_line(&e), event_of(&e));
                    self.finish(Err(msg), event, Some(Err(e)))
                }
                None => {
                    let rows = self.rows;
                    self.finish(Ok(rows), None, None)
                }
            };
            if self.writing.is_none() {
                return Poll::Ready(item);
            }
        }
    }
}

impl datafusion::execution::RecordBatchStream for AuditedStream {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }
}

impl Drop for AuditedStream {
    fn drop(&mut self) {
        if let Some(mut p) = self.pending.take() {
            let outcome = Err("cancelled: the client stopped reading".into());
            p.count(&outcome, None, true);
            if let Some(log) = p.log.take() {
                log.write_detached(&p.records(outcome, None));
            }
        }
    }
}

/// The Arrow bytes a batch returns: its slices of the buffers it shares (a `LIMIT`'s
/// slice counts its own rows, not its parent buffer's).
fn returned_bytes(b: &RecordBatch) -> u64 {
    b.columns()
        .iter()
        .map(|c| {
            c.to_data()
                .get_slice_memory_size()
                .unwrap_or_else(|_| c.get_array_memory_size()) as u64
        })
        .sum()
}

/// The statement's kind, one word for the metrics' `kind` label (a fixed set: never text
/// of the statement).
pub(super) fn statement_kind(stmt: &Statement) -> &'static str {
    use datafusion::sql::sqlparser::ast::Statement as S;
    match stmt {
        Statement::Statement(s) => match s.as_ref() {
            S::Query(_) => "select",
            S::Insert(_) => "insert",
            S::Update { .. } => "update",
            S::Delete(_) => "delete",
            S::Merge { .. } => "merge",
            S::CreateTable(_) | S::CreateView { .. } | S::CreateSchema { .. } => "create",
            S::Drop { .. } | S::DropFunction { .. } => "drop",
            S::AlterTable { .. } => "alter",
            S::Explain { .. } | S::ExplainTable { .. } => "explain",
            S::ShowTables { .. }
            | S::ShowColumns { .. }
            | S::ShowVariable { .. }
            | S::ShowFunctions { .. }
            | S::ShowCreate { .. }
            | S::ShowSchemas { .. } => "show",
            S::Set(_) => "set",
            S::StartTransaction { .. } | S::Commit { .. } | S::Rollback { .. } => "transaction",
            S::Truncate { .. } => "truncate",
            _ => "other",
        },
        Statement::CreateExternalTable(_) => "create",
        Statement::CopyTo(_) => "copy",
        Statement::Explain(_) => "explain",
        Statement::Reset(_) => "set",
    }
}

/// The audit action and resource of a statement stopped by confinement or a limit.
pub(super) fn event_of(e: &DataFusionError) -> Option<(String, String)> {
    if let Some(r) = refusal_of(e) {
        return Some((r.action().to_owned(), r.resource()));
    }
    if let Some(l) = limit_of(e) {
        let what = match l {
            LimitExceeded::Timeout { .. } => "statement_timeout",
            LimitExceeded::Concurrency { .. } => "max_concurrent_statements",
            LimitExceeded::Rows { .. } => "max_result_rows",
            LimitExceeded::Bytes { .. } => "max_result_bytes",
        };
        return Some(("limit".to_owned(), format!("limit:{what}")));
    }
    // Any level may be the memory limit (DataFusion wraps it in Context/Shared).
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(DataFusionError::ResourcesExhausted(_)) = err.downcast_ref() {
            return Some(("limit".to_owned(), "limit:query_memory".to_owned()));
        }
        cur = err.source();
    }
    None
}
