//! A principal's SQL session: every query is planned under the policy and audited.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use clearice_access::{Caller, QueryAccess, SessionAccess, one_line};

use crate::guard::{contained, panic_error, with_types_of};
use clearice_iceberg::IcebergCatalogProvider;
use clearice_policy::AuditRecord;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::Statement;
use futures::TryStreamExt;
use sha2::{Digest, Sha256};

use crate::audit::AuditLog;
use clearice_access::confine::{Confinement, refusal_of};
use clearice_access::limits::{LimitExceeded, LimitedStream, SessionLimits, limit_of};

mod audit;
mod ddl;
mod ingest;

use audit::{AuditedStream, event_of};
use ddl::{CreateOptions, alter_of, merge_of, take_table_options};

/// What a statement is planned for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// To run it.
    Run,
    /// For its result schema only (Flight plans every statement before running it):
    /// catalog changes, MERGE and ALTER TABLE, which run when planned, do not run.
    Describe,
}

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

/// One principal's session. Every statement goes through [`Session::sql`],
/// [`Session::execute`] or the streaming variants: planned under the policy, checked by the
/// session's confinement, audited. The inner `SessionContext` is not exposed (no `Deref`),
/// so an embedder cannot bypass them by accident.
pub struct Session {
    ctx: SessionContext,
    access: Arc<SessionAccess>,
    audit: Option<Arc<AuditLog>>,
    catalogs: Vec<Arc<IcebergCatalogProvider>>,
    /// Set for network principals (and a confined shell): what the session may touch.
    confine: Option<Arc<Confinement>>,
    limits: Option<SessionLimits>,
    /// Options the last statements `SET` (name, value), for front ends that keep them.
    set_options: std::sync::Mutex<Vec<(String, String)>>,
    /// Why the session could not be set up: every statement fails with it.
    pub(crate) setup_error: Option<String>,
}

/// DataFusion's in-memory catalog (its `datafusion` default): session tables such as
/// `CREATE EXTERNAL TABLE`'s live there.
pub const SCRATCH_CATALOG: &str = "datafusion";

/// How stale a catalog's table listing may be when a statement starts.
pub const CATALOG_LISTING_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(1);

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
        catalogs: Vec<Arc<IcebergCatalogProvider>>,
    ) -> Self {
        Self {
            ctx,
            access,
            audit,
            catalogs,
            confine: None,
            limits: None,
            set_options: std::sync::Mutex::default(),
            setup_error: None,
        }
    }

    pub(crate) fn confine(&mut self, guard: Arc<Confinement>, limits: SessionLimits) {
        self.confine = Some(guard);
        self.limits = Some(limits);
    }

    /// Whether the session is confined (network principal or `[shell] confine`).
    pub fn is_confined(&self) -> bool {
        self.confine.is_some()
    }

    /// Plans a statement; a confined session checks the plan before anything runs (DDL
    /// runs when planned: `CREATE EXTERNAL TABLE` would infer a schema from the file).
    async fn plan(
        &self,
        sql: &str,
        params: Option<datafusion::common::ParamValues>,
    ) -> Result<datafusion::dataframe::DataFrame> {
        self.statement_plan(self.parse(sql)?, params, Purpose::Run)
            .await
    }

    /// Plans SQL for its result schema only ([`Purpose::Describe`]).
    async fn describe(&self, sql: &str) -> Result<datafusion::dataframe::DataFrame> {
        self.statement_plan(self.parse(sql)?, None, Purpose::Describe)
            .await
    }

    /// Parses one statement with the session's dialect, through ClearIce's parser: time
    /// travel and `PARTITIONED BY` become typed AST nodes (`clearice_iceberg::sql`).
    fn parse(&self, sql: &str) -> Result<Statement> {
        let (dialect, recursion_limit) = {
            let state = self.ctx.state_ref();
            let state = state.read();
            let o = &state.config().options().sql_parser;
            (o.dialect, o.recursion_limit)
        };
        let d = datafusion::sql::sqlparser::dialect::dialect_from_str(dialect)
            .ok_or_else(|| DataFusionError::Plan(format!("Unsupported SQL dialect: {dialect}")))?;
        let mut statements =
            clearice_iceberg::sql::parse_statements(sql, d.as_ref(), recursion_limit)?;
        match statements.len() {
            1 => Ok(statements.remove(0)),
            0 => Err(DataFusionError::Plan(
                "No SQL statements were provided in the query string".into(),
            )),
            _ => Err(DataFusionError::NotImplemented(
                "The context currently only supports a single SQL statement".into(),
            )),
        }
    }

    /// The state to plan `stmt` in: the tables it reads as of a snapshot are opened first
    /// (under the policy, as any table is), for the travel planner to plan.
    async fn planning_state(
        &self,
        stmt: &Statement,
    ) -> Result<datafusion::execution::SessionState> {
        let mut state = self.ctx.state();
        let versioned = clearice_iceberg::travel::versioned_tables(stmt);
        if versioned.is_empty() {
            return Ok(state);
        }
        let (normalize, catalog, schema) = {
            let o = state.config().options();
            (
                o.sql_parser.enable_ident_normalization,
                o.catalog.default_catalog.clone(),
                o.catalog.default_schema.clone(),
            )
        };
        let mut planner = clearice_iceberg::travel::TravelPlanner::default();
        let mut opened = Vec::new();
        for (name, version) in versioned {
            let as_of = clearice_iceberg::travel::as_of(&version)?;
            let reference =
                datafusion::sql::planner::object_name_to_table_reference(name, normalize)?;
            if opened.contains(&(reference.clone(), as_of.clone())) {
                continue;
            }
            let resolved = reference.clone().resolve(&catalog, &schema);
            let provider = match self.iceberg_catalog(Some(&resolved.catalog)) {
                Some(cat) => {
                    clearice_access::SessionCatalogProvider::new(
                        Arc::clone(cat),
                        Arc::clone(&self.access),
                    )
                    .table_as_of(&resolved.schema, &resolved.table, &as_of)
                    .await?
                }
                None if self.ctx.table_exist(reference.clone())? => {
                    return Err(DataFusionError::Plan(format!(
                        "time travel ({as_of}) reads Iceberg catalog tables; '{reference}' is not one"
                    )));
                }
                None => None,
            }
            .ok_or_else(|| DataFusionError::Plan(format!("table '{reference}' not found")))?;
            planner.add(reference.clone(), as_of.clone(), provider);
            opened.push((reference, as_of));
        }
        state.register_relation_planner(Arc::new(planner))?;
        Ok(state)
    }

    /// The one router of statements: every front end's statement is planned here, to run
    /// it or only for its result schema. MERGE and ALTER TABLE of catalog tables run here
    /// (DataFusion does not plan them); the rest is checked by [`Session::checked`].
    async fn statement_plan(
        &self,
        stmt: Statement,
        params: Option<datafusion::common::ParamValues>,
        purpose: Purpose,
    ) -> Result<datafusion::dataframe::DataFrame> {
        if let Some(q) = QueryAccess::current() {
            q.set_kind(audit::statement_kind(&stmt));
        }
        // Boxed: opening tables and planning are large futures, and front ends nest
        // this deep.
        let state = Box::pin(self.planning_state(&stmt)).await?;
        if let Some(a) = alter_of(&stmt) {
            match purpose {
                Purpose::Run => {
                    if let Some(df) = self.alter_table(a).await? {
                        return Ok(df);
                    }
                }
                Purpose::Describe => {
                    let name = datafusion::common::TableReference::parse_str(&a.name.to_string());
                    if self.iceberg_table(&name).is_some() {
                        return self.schema_only(false);
                    }
                }
            }
        }
        if let Some(m) = merge_of(&stmt) {
            if purpose == Purpose::Describe {
                return self.schema_only(true);
            }
            // Boxed: a MERGE's future is large, and front ends nest it deep.
            let rows = Box::pin(self.merge(&state, m)).await?;
            return self
                .ctx
                .read_batch(clearice_iceberg::dml::count_batch(rows)?);
        }
        let (stmt, options) = take_table_options(stmt)?;
        let mut plan = Box::pin(state.statement_to_plan(stmt)).await?;
        if let Some(p) = params {
            plan = plan.with_param_values(p)?;
        }
        if purpose == Purpose::Describe
            && let Some(rows) = self.reports_rows(&plan)
        {
            return self.schema_only(rows);
        }
        // Boxed: checking and planning a statement (DDL, row-level writes) is a large
        // future, and front ends nest it deep.
        Box::pin(self.checked(plan, options)).await
    }

    /// For a statement that runs when planned or runs its own way (catalog changes,
    /// row-level writes), whether its result is a row count (`None`: planning it is
    /// harmless, and its plan gives the schema).
    fn reports_rows(&self, plan: &datafusion::logical_expr::LogicalPlan) -> Option<bool> {
        use datafusion::logical_expr::{DdlStatement, LogicalPlan};
        match plan {
            LogicalPlan::Ddl(DdlStatement::CreateMemoryTable(c))
                if self.iceberg_table(&c.name).is_some() =>
            {
                Some(
                    !matches!(c.input.as_ref(), LogicalPlan::EmptyRelation(e) if !e.produce_one_row),
                )
            }
            LogicalPlan::Ddl(DdlStatement::DropTable(d))
                if self.iceberg_table(&d.name).is_some() =>
            {
                Some(false)
            }
            // Checked and planned when it runs (its subqueries run then).
            LogicalPlan::Dml(d)
                if matches!(
                    d.op,
                    datafusion::logical_expr::WriteOp::Delete
                        | datafusion::logical_expr::WriteOp::Update
                ) && clearice_access::write_rules::is_policy_target(&d.target) =>
            {
                Some(true)
            }
            LogicalPlan::Ddl(
                DdlStatement::CreateCatalogSchema(_) | DdlStatement::DropCatalogSchema(_),
            ) if !self.catalogs.is_empty() => Some(false),
            _ => None,
        }
    }

    /// An empty result with the schema of a row count (`rows`) or no columns.
    fn schema_only(&self, rows: bool) -> Result<datafusion::dataframe::DataFrame> {
        let schema = if rows {
            clearice_iceberg::dml::count_schema()
        } else {
            Arc::new(datafusion::arrow::datatypes::Schema::empty())
        };
        let empty = datafusion::logical_expr::LogicalPlan::EmptyRelation(
            datafusion::logical_expr::EmptyRelation {
                produce_one_row: false,
                schema: Arc::new(datafusion::common::DFSchema::try_from(
                    schema.as_ref().clone(),
                )?),
            },
        );
        Ok(datafusion::dataframe::DataFrame::new(
            self.ctx.state(),
            empty,
        ))
    }

    /// Checks a planned statement (setup, confinement, copy formats, write rules, named
    /// columns) and sends it down its [`crate::route::Route`]; `options` are a CREATE
    /// TABLE's properties and partition terms.
    async fn checked(
        &self,
        plan: datafusion::logical_expr::LogicalPlan,
        options: CreateOptions,
    ) -> Result<datafusion::dataframe::DataFrame> {
        if let Some(e) = &self.setup_error {
            return Err(DataFusionError::Execution(e.clone()));
        }
        if let Some(df) = self.iceberg_ddl(&plan, options.clone()).await? {
            return Ok(df);
        }
        if !options.properties.is_empty() {
            return Err(DataFusionError::Plan(
                "table properties (WITH (...) / TBLPROPERTIES) apply to Iceberg catalog tables only".into(),
            ));
        }
        if !options.partitioning.is_empty() {
            return Err(DataFusionError::Plan(
                "PARTITIONED BY applies to Iceberg catalog tables only".into(),
            ));
        }
        if let Some(c) = &self.confine {
            c.check_plan(&plan).await?;
        }
        self.check_session_objects(&plan)?;
        check_copy_formats(&plan)?;
        let state = self.ctx.state();
        clearice_access::write_rules::check_statement(&plan, &|p| state.optimize(p))?;
        // Denials follow what the statement names, not what the optimizer keeps.
        clearice_access::named::check_named_columns(&plan)?;
        // DELETE and UPDATE run as written (their predicate never from optimized plans).
        if crate::route::route(&plan) == crate::route::Route::RowLevel
            && let Some(write) = clearice_access::row_level::RowLevelStatement::of(&plan)?
        {
            // Boxed: planning runs the statement's subqueries (a large future).
            let exec = Box::pin(write.plan(&state)).await?;
            return self
                .ctx
                .read_table(Arc::new(clearice_access::row_level::PlannedWrite::new(
                    exec,
                )));
        }
        let set = match &plan {
            datafusion::logical_expr::LogicalPlan::Statement(
                datafusion::logical_expr::Statement::SetVariable(v),
            ) => Some((v.variable.clone(), v.value.clone())),
            _ => None,
        };
        let df = self.ctx.execute_logical_plan(plan).await?;
        if let Some(s) = set {
            self.set_options.lock().expect("set options").push(s);
        }
        Ok(df)
    }

    /// Options changed by `SET` statements since the last call (name, value), so a front
    /// end whose sessions last longer than one call (Flight SQL) can apply them again.
    pub fn take_set_options(&self) -> Vec<(String, String)> {
        std::mem::take(&mut *self.set_options.lock().expect("set options"))
    }

    /// Sets a session option as `SET name = value` would, with the same checks (a confined
    /// session accepts only the allow-list).
    pub fn set_option(&self, name: &str, value: &str) -> Result<()> {
        if let Some(c) = &self.confine {
            c.check_setting(name, value)?;
        }
        let state = self.ctx.state_ref();
        let mut state = state.write();
        state.config_mut().options_mut().set(name, value)
    }

    fn timeout(&self) -> Option<std::time::Duration> {
        self.limits.as_ref()?.config.statement_timeout()
    }

    /// A concurrency permit for one more statement of this principal.
    fn permit(&self) -> Result<Option<tokio::sync::OwnedSemaphorePermit>> {
        let Some(l) = &self.limits else {
            return Ok(None);
        };
        match l.config.max_concurrent() {
            Some(n) => l
                .permits
                .acquire(self.principal(), n)
                .map(Some)
                .map_err(|e| DataFusionError::External(Box::new(e))),
            None => Ok(None),
        }
    }

    /// Lists the catalogs' namespaces and tables again if the listing is older than
    /// [`CATALOG_LISTING_MAX_AGE`] (tables created or dropped by other writers). Called
    /// before every statement; metadata endpoints call it too.
    pub async fn refresh_catalogs(&self) {
        for c in &self.catalogs {
            c.refresh_if_older(CATALOG_LISTING_MAX_AGE).await;
        }
    }

    /// The principal (fixed for the session's life).
    pub fn principal(&self) -> &str {
        self.access.principal()
    }

    /// Names of the catalogs this session sees.
    ///
    /// DataFusion's in-memory catalog ([`SCRATCH_CATALOG`]) is left out while it holds no
    /// table and is not the default: clients list it as an empty catalog otherwise.
    pub fn catalog_names(&self) -> Vec<String> {
        let (default, _) = self.namespace();
        self.ctx
            .catalog_names()
            .into_iter()
            .filter(|name| {
                name != SCRATCH_CATALOG
                    || *name == default
                    || self.ctx.catalog(name).is_some_and(|c| {
                        c.schema_names().iter().any(|s| {
                            s != "information_schema"
                                && c.schema(s).is_some_and(|s| !s.table_names().is_empty())
                        })
                    })
            })
            .collect()
    }

    /// A catalog as this session's principal sees it (tables under the policy).
    pub fn catalog(&self, name: &str) -> Option<Arc<dyn datafusion::catalog::CatalogProvider>> {
        self.ctx.catalog(name)
    }

    /// Whether results describe their columns (Flight SQL's column metadata: the table
    /// each comes from, its SQL type, precision and scale): for Flight SQL sessions.
    fn describes_columns(&self) -> bool {
        self.access.caller().front() == clearice_access::FrontEnd::FlightSql
    }

    /// The result schema of a planned statement as its client is shown it: for a
    /// Flight SQL session with each column described (the table it is read from, its
    /// SQL type, precision and scale as Flight SQL column metadata).
    pub fn result_schema(&self, df: &datafusion::dataframe::DataFrame) -> SchemaRef {
        if !self.describes_columns() {
            return Arc::new(df.schema().as_arrow().clone());
        }
        let (catalog, schema) = self.namespace();
        let catalogs: Vec<&str> = self.catalogs.iter().map(|c| c.name()).collect();
        crate::columns::described(df.logical_plan(), &catalog, &schema, &catalogs)
    }

    /// The catalog and schema that unqualified table names resolve in.
    pub fn namespace(&self) -> (String, String) {
        let state = self.ctx.state_ref();
        let state = state.read();
        let c = &state.config().options().catalog;
        (c.default_catalog.clone(), c.default_schema.clone())
    }

    /// Sets the catalog and schema that unqualified table names resolve in (Flight SQL
    /// session options; the JDBC driver's `catalog=`). An unknown catalog or schema is an
    /// error naming it; `None` keeps the current one.
    pub fn use_namespace(&self, catalog: Option<&str>, schema: Option<&str>) -> Result<()> {
        // Look up first: the context's accessors take the state lock themselves.
        let (current, _) = self.namespace();
        let cat_name = catalog.unwrap_or(&current);
        let cat = self.ctx.catalog(cat_name).ok_or_else(|| {
            DataFusionError::Plan(format!(
                "catalog '{cat_name}' not found (catalogs: {})",
                self.ctx.catalog_names().join(", ")
            ))
        })?;
        if let Some(s) = schema
            && !cat.schema_names().iter().any(|n| n == s)
        {
            return Err(DataFusionError::Plan(format!(
                "schema '{s}' not found in catalog '{cat_name}'"
            )));
        }
        self.set_namespace(catalog, schema);
        Ok(())
    }

    /// Sets the default catalog and schema without looking them up (a server's or
    /// user's configured default: a schema created later still counts).
    pub(crate) fn set_namespace(&self, catalog: Option<&str>, schema: Option<&str>) {
        let state = self.ctx.state_ref();
        let mut state = state.write();
        let options = &mut state.config_mut().options_mut().catalog;
        if let Some(c) = catalog {
            options.default_catalog = c.to_owned();
        }
        if let Some(s) = schema {
            options.default_schema = s.to_owned();
        }
    }

    /// Plans and runs SQL text (one statement) to completion, auditing table access.
    pub async fn sql(&self, sql: &str) -> Result<QueryOutput> {
        self.refresh_catalogs().await;
        self.audited(sql, async move {
            let _permit = self.permit()?;
            collect(self.plan(sql, None).await?).await
        })
        .await
    }

    /// Runs a parsed statement (no round trip through SQL text), auditing table access.
    pub async fn execute(&self, stmt: Statement) -> Result<QueryOutput> {
        self.refresh_catalogs().await;
        let text = stmt.to_string();
        self.audited(&text, async move {
            let _permit = self.permit()?;
            collect(self.statement_plan(stmt, None, Purpose::Run).await?).await
        })
        .await
    }

    async fn audited(
        &self,
        sql: &str,
        run: impl Future<Output = Result<QueryOutput>>,
    ) -> Result<QueryOutput> {
        let query = QueryAccess::until(self.timeout());
        let id = query_id();
        let run = contained(run);
        let result = query
            .scope(async {
                match self.timeout() {
                    Some(limit) => tokio::time::timeout(limit, run).await.unwrap_or_else(|_| {
                        Err(DataFusionError::External(Box::new(
                            LimitExceeded::Timeout { limit },
                        )))
                    }),
                    None => run.await,
                }
            })
            .await;
        self.write_audit(&id, sql, &query, &result).await?;
        result
    }

    /// Plans SQL without running it (result schema, parameter types). Only refusals are
    /// audited (a hidden table, an unknown principal): a plan reads no data.
    pub async fn sql_plan(&self, sql: &str) -> Result<datafusion::dataframe::DataFrame> {
        self.refresh_catalogs().await;
        let query = QueryAccess::until(None);
        let planned = query
            .scope(async {
                match self.timeout() {
                    Some(limit) => tokio::time::timeout(limit, contained(self.describe(sql)))
                        .await
                        .unwrap_or_else(|_| {
                            Err(DataFusionError::External(Box::new(
                                LimitExceeded::Timeout { limit },
                            )))
                        }),
                    None => contained(self.describe(sql)).await,
                }
            })
            .await;
        let accesses = query.take();
        // Every Flight query is planned once before it runs: no audit work unless refused
        // (a statement that fails to plan is still counted in the metrics).
        if let Err(e) = &planned {
            let refused = accesses.iter().any(|a| !a.allowed) || event_of(e).is_some();
            let pending = self
                .pending_audit(&query_id(), sql, accesses)
                .noting(&query);
            if refused {
                pending
                    .write(Err(one_line(e)), event_of(e))
                    .await
                    .map_err(|a| DataFusionError::External(Box::new(a)))?;
            } else {
                pending.count(&Err(one_line(e)), None, false);
            }
        }
        planned
    }

    /// Plans and starts SQL, returning its result as a stream (batch by batch). Audit
    /// records are written when the stream ends, fails, or is dropped early (a client that
    /// went away: `error = "cancelled..."`); denials are written before the error returns.
    pub async fn sql_stream(&self, sql: &str) -> Result<SendableRecordBatchStream> {
        self.sql_stream_with_params(sql, None).await
    }

    /// [`Session::sql_stream`] with `$1..$n` parameter values.
    pub async fn sql_stream_with_params(
        &self,
        sql: &str,
        params: Option<datafusion::common::ParamValues>,
    ) -> Result<SendableRecordBatchStream> {
        self.start_stream(sql, async { self.plan(sql, params).await })
            .await
    }

    /// Runs a parsed statement as a stream (batch by batch, audited like
    /// [`Session::sql_stream`]): results of any size in bounded memory.
    pub async fn execute_stream(&self, stmt: Statement) -> Result<SendableRecordBatchStream> {
        let text = stmt.to_string();
        self.start_stream(&text, async {
            self.statement_plan(stmt, None, Purpose::Run).await
        })
        .await
    }

    async fn start_stream(
        &self,
        sql: &str,
        planned: impl Future<Output = Result<datafusion::dataframe::DataFrame>>,
    ) -> Result<SendableRecordBatchStream> {
        self.refresh_catalogs().await;
        let query = QueryAccess::until(self.timeout());
        let id = query_id();
        let deadline = query
            .deadline()
            .map(|d| (tokio::time::Instant::from_std(d.at), d.limit));
        let started = contained(async {
            let permit = self.permit()?;
            let df = planned.await?;
            let announced = Arc::new(df.schema().as_arrow().clone());
            let described = self.describes_columns().then(|| self.result_schema(&df));
            let stream = with_types_of(&announced, df.execute_stream().await?)?;
            let stream = match described {
                Some(d) => crate::columns::describe_stream(stream, &d),
                None => stream,
            };
            Ok((stream, permit))
        });
        let started =
            query
                .scope(async {
                    match deadline {
                        Some((at, limit)) => tokio::time::timeout_at(at, started)
                            .await
                            .unwrap_or_else(|_| {
                                Err(DataFusionError::External(Box::new(
                                    LimitExceeded::Timeout { limit },
                                )))
                            }),
                        None => started.await,
                    }
                })
                .await;
        let pending = self.pending_audit(&id, sql, query.take()).noting(&query);
        match started {
            Ok((inner, permit)) => {
                let inner: SendableRecordBatchStream = match &self.limits {
                    Some(l) => Box::pin(LimitedStream::new(inner, deadline, &l.config, permit)),
                    None => inner,
                };
                Ok(Box::pin(AuditedStream::new(inner, pending)))
            }
            Err(e) => {
                pending
                    .write(Err(one_line(&e)), event_of(&e))
                    .await
                    .map_err(|a| DataFusionError::External(Box::new(a)))?;
                Err(e)
            }
        }
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("caller", self.access.caller())
            .finish_non_exhaustive()
    }
}

async fn collect(df: datafusion::dataframe::DataFrame) -> Result<QueryOutput> {
    // The executed plan's schema (what the batches carry), not the logical one.
    let stream = df.execute_stream().await?;
    let schema = stream.schema();
    let batches = stream.try_collect().await?;
    Ok(QueryOutput { schema, batches })
}

/// The `count` a write reports (0 if the output is not one).
fn reported_count(out: &QueryOutput) -> u64 {
    use datafusion::arrow::array::UInt64Array;
    out.batches
        .iter()
        .filter_map(|b| b.column_by_name("count"))
        .filter_map(|c| c.as_any().downcast_ref::<UInt64Array>())
        .flat_map(|a| a.iter().flatten())
        .sum()
}

/// `COPY ... STORED AS CSV` of nested columns fails while planning, naming the column,
/// instead of failing in the CSV writer after the output file was created.
fn check_copy_formats(plan: &datafusion::logical_expr::LogicalPlan) -> Result<()> {
    use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
    use datafusion::logical_expr::LogicalPlan;
    let mut problem = None;
    plan.apply(|node| {
        if let LogicalPlan::Copy(c) = node
            && c.file_type.get_ext().eq_ignore_ascii_case("csv")
            && let Some(f) = c
                .input
                .schema()
                .fields()
                .iter()
                .find(|f| f.data_type().is_nested())
        {
            problem = Some(DataFusionError::Plan(format!(
                "COPY TO '{}' STORED AS CSV: column '{}' is a {} which CSV cannot hold; select it as text (e.g. CAST to VARCHAR) or write PARQUET or JSON",
                c.output_url,
                f.name(),
                match f.data_type() {
                    datafusion::arrow::datatypes::DataType::Struct(_) => "struct",
                    datafusion::arrow::datatypes::DataType::Map(..) => "map",
                    datafusion::arrow::datatypes::DataType::Union(..) => "union",
                    _ => "list",
                }
            )));
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    problem.map_or(Ok(()), Err)
}
