//! A principal's SQL session: every query is planned under the policy and audited.

use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use clearice_policy::AuditRecord;
use clearice_table::SessionAccess;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::error::{DataFusionError, Result};
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::Statement;
use futures::TryStreamExt;
use sha2::{Digest, Sha256};

use crate::audit::AuditLog;

/// A query's result.
#[derive(Debug)]
pub struct QueryOutput {
    /// Result schema.
    pub schema: SchemaRef,
    /// Result batches.
    pub batches: Vec<RecordBatch>,
}

impl QueryOutput {
    /// Row count.
    pub fn rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }
}

/// One principal's session. Dereferences to its `SessionContext` (unaudited access, for
/// tests and embedding); [`Session::sql`] and [`Session::execute`] audit.
pub struct Session {
    ctx: SessionContext,
    access: Arc<SessionAccess>,
    audit: Option<Arc<AuditLog>>,
    client: String,
}

static QUERY_SEQ: AtomicU64 = AtomicU64::new(1);

fn query_id() -> String {
    static RUN: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let run = RUN.get_or_init(rand::random::<u32>);
    format!("{run:08x}-{}", QUERY_SEQ.fetch_add(1, Ordering::Relaxed))
}

impl Session {
    pub(crate) fn new(
        ctx: SessionContext,
        access: Arc<SessionAccess>,
        audit: Option<Arc<AuditLog>>,
        client: String,
    ) -> Self {
        Self {
            ctx,
            access,
            audit,
            client,
        }
    }

    /// The principal (fixed for the session's life).
    pub fn principal(&self) -> &str {
        self.access.principal()
    }

    /// The DataFusion context.
    pub fn ctx(&self) -> &SessionContext {
        &self.ctx
    }

    /// Plans and runs SQL text (one statement) to completion, auditing table access.
    pub async fn sql(&self, sql: &str) -> Result<QueryOutput> {
        let ctx = &self.ctx;
        self.audited(sql, async move { collect(ctx.sql(sql).await?).await })
            .await
    }

    /// Runs a parsed statement (no round trip through SQL text), auditing table access.
    pub async fn execute(&self, stmt: Statement) -> Result<QueryOutput> {
        let text = stmt.to_string();
        let ctx = &self.ctx;
        self.audited(&text, async move {
            let plan = ctx.state().statement_to_plan(stmt).await?;
            collect(ctx.execute_logical_plan(plan).await?).await
        })
        .await
    }

    async fn audited(
        &self,
        sql: &str,
        run: impl Future<Output = Result<QueryOutput>>,
    ) -> Result<QueryOutput> {
        let _ = self.access.take();
        let id = query_id();
        let result = run.await;
        self.write_audit(&id, sql, &result)?;
        result
    }

    fn write_audit(&self, id: &str, sql: &str, result: &Result<QueryOutput>) -> Result<()> {
        let accesses = self.access.take();
        let Some(log) = &self.audit else {
            return Ok(());
        };
        let sql_sha256 = hex::encode(Sha256::digest(sql.as_bytes()));
        for a in accesses {
            let error = match result {
                Err(e) => Some(one_line(e)),
                Ok(_) => a.error,
            };
            let record = AuditRecord {
                time: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                user: self.principal().to_owned(),
                client: self.client.clone(),
                query_id: id.to_owned(),
                sql_sha256: sql_sha256.clone(),
                table: a.table,
                columns: a.columns,
                allowed: a.allowed,
                rows: result.as_ref().ok().map(|o| o.rows() as u64),
                error,
            };
            log.write(&record)
                .map_err(|e| DataFusionError::External(Box::new(e)))?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("principal", &self.principal())
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

impl Deref for Session {
    type Target = SessionContext;
    fn deref(&self) -> &SessionContext {
        &self.ctx
    }
}

async fn collect(df: datafusion::dataframe::DataFrame) -> Result<QueryOutput> {
    let schema = SchemaRef::new(df.schema().as_arrow().clone());
    let batches = df.execute_stream().await?.try_collect().await?;
    Ok(QueryOutput { schema, batches })
}

/// An error on one line.
pub fn one_line(e: &impl std::fmt::Display) -> String {
    e.to_string()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}
