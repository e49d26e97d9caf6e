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
        let sql = clearice_iceberg::travel::rewrite_sql(sql)?;
        let state = self.ctx.state();
        let dialect = state.config().options().sql_parser.dialect;
        let stmt = state.sql_to_statement(&sql, &dialect)?;
        self.statement_plan(stmt, params).await
    }

    /// Plans a parsed statement (MERGE runs here: DataFusion does not plan it), with its
    /// `$1..$n` values bound before any check (the checks see the values that run).
    async fn statement_plan(
        &self,
        stmt: Statement,
        params: Option<datafusion::common::ParamValues>,
    ) -> Result<datafusion::dataframe::DataFrame> {
        if let Some(a) = alter_of(&stmt)
            && let Some(df) = self.alter_table(a).await?
        {
            return Ok(df);
        }
        if let Some(m) = merge_of(&stmt) {
            // Boxed: a MERGE's future is large, and front ends nest it deep.
            let rows = Box::pin(self.merge(m)).await?;
            return self
                .ctx
                .read_batch(clearice_iceberg::dml::count_batch(rows)?);
        }
        let (stmt, properties) = take_table_properties(stmt)?;
        let mut plan = self.ctx.state().statement_to_plan(stmt).await?;
        if let Some(p) = params {
            plan = plan.with_param_values(p)?;
        }
        // Boxed: checking and planning a statement (DDL, row-level writes) is a large
        // future, and front ends nest it deep.
        Box::pin(self.checked_with(plan, properties)).await
    }

    /// `ALTER TABLE` of an Iceberg table (`None` for other tables: DataFusion's answer).
    async fn alter_table(
        &self,
        a: &datafusion::sql::sqlparser::ast::AlterTable,
    ) -> Result<Option<datafusion::dataframe::DataFrame>> {
        use clearice_access::ddl::Ddl;
        use clearice_iceberg::ddl::AlterColumn;
        use datafusion::sql::sqlparser::ast::{AlterTableOperation as Op, ColumnOption};
        if let Some(e) = &self.setup_error {
            return Err(DataFusionError::Execution(e.clone()));
        }
        let reference = datafusion::common::TableReference::parse_str(&a.name.to_string());
        let Some((cat, ns, table)) = self.iceberg_table(&reference) else {
            return Ok(None);
        };
        let mut ops = Vec::new();
        for op in &a.operations {
            match op {
                Op::AddColumn { column_def, .. } => {
                    // The SQL type as DataFusion maps it.
                    let typed = self
                        .ctx
                        .state()
                        .create_logical_plan(&format!(
                            "SELECT CAST(NULL AS {}) AS c",
                            column_def.data_type
                        ))
                        .await?;
                    ops.push(AlterColumn::Add {
                        name: column_def.name.value.clone(),
                        data_type: typed.schema().field(0).data_type().clone(),
                        nullable: !column_def
                            .options
                            .iter()
                            .any(|o| matches!(o.option, ColumnOption::NotNull)),
                    });
                }
                Op::DropColumn {
                    column_names,
                    if_exists,
                    ..
                } => ops.extend(column_names.iter().map(|c| AlterColumn::Drop {
                    name: c.value.clone(),
                    if_exists: *if_exists,
                })),
                Op::RenameColumn {
                    old_column_name,
                    new_column_name,
                } => ops.push(AlterColumn::Rename {
                    from: old_column_name.value.clone(),
                    to: new_column_name.value.clone(),
                }),
                other => {
                    return Err(DataFusionError::NotImplemented(format!(
                        "ALTER TABLE ... {other} is not supported (ADD COLUMN, DROP COLUMN, RENAME COLUMN are)"
                    )));
                }
            }
        }
        Ddl {
            catalog: cat.as_ref(),
            access: &self.access,
        }
        .alter_table(&ns, &table, &ops)
        .await?;
        Ok(Some(datafusion::dataframe::DataFrame::new(
            self.ctx.state(),
            datafusion::logical_expr::LogicalPlanBuilder::empty(false).build()?,
        )))
    }

    /// `MERGE INTO` an Iceberg table (copy-on-write, under the policy).
    async fn merge(&self, m: &datafusion::sql::sqlparser::ast::Merge) -> Result<u64> {
        use datafusion::sql::sqlparser::ast::TableFactor;
        if let Some(e) = &self.setup_error {
            return Err(DataFusionError::Execution(e.clone()));
        }
        let TableFactor::Table { name, .. } = &m.table else {
            return Err(DataFusionError::Plan(
                "MERGE INTO needs a table as its target".into(),
            ));
        };
        let reference = datafusion::common::TableReference::parse_str(&name.to_string());
        let Some((cat, ns, table)) = self.iceberg_table(&reference) else {
            return Err(DataFusionError::NotImplemented(format!(
                "MERGE INTO '{name}': only Iceberg catalog tables can be merged into"
            )));
        };
        // The source reads what a SELECT would: confined sessions check its paths.
        let state = self.ctx.state();
        let source = state
            .create_logical_plan(&format!("SELECT * FROM {}", m.source))
            .await?;
        if let Some(c) = &self.confine {
            c.check_plan(&source).await?;
        }
        let full = datafusion::common::TableReference::full(cat.name().to_owned(), ns, table);
        let provider = self.ctx.table_provider(full.clone()).await?;
        let target = provider
            .as_any()
            .downcast_ref::<clearice_access::PolicyTableProvider>()
            .ok_or_else(|| {
                DataFusionError::Plan(format!("table '{full}' cannot be merged into"))
            })?;
        Box::pin(clearice_access::merge::merge(&state, target, m)).await
    }

    /// Plans a statement for its result schema only: Iceberg catalog changes, which
    /// run when planned, are not run (Flight plans every statement before running it).
    async fn plan_for_schema(&self, sql: &str) -> Result<datafusion::dataframe::DataFrame> {
        use datafusion::logical_expr::{DdlStatement, EmptyRelation, LogicalPlan};
        let text = clearice_iceberg::travel::rewrite_sql(sql)?;
        let state = self.ctx.state();
        let dialect = state.config().options().sql_parser.dialect;
        let stmt = state.sql_to_statement(&text, &dialect)?;
        let merging = merge_of(&stmt).is_some();
        if let Some(a) = alter_of(&stmt)
            && self
                .iceberg_table(&datafusion::common::TableReference::parse_str(
                    &a.name.to_string(),
                ))
                .is_some()
        {
            return Ok(datafusion::dataframe::DataFrame::new(
                self.ctx.state(),
                datafusion::logical_expr::LogicalPlanBuilder::empty(false).build()?,
            ));
        }
        let plan = if merging {
            LogicalPlan::EmptyRelation(EmptyRelation {
                produce_one_row: false,
                schema: Arc::new(datafusion::common::DFSchema::empty()),
            })
        } else {
            state
                .statement_to_plan(take_table_properties(stmt)?.0)
                .await?
        };
        let reports_rows = match &plan {
            _ if merging => Some(true),
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
        };
        match reports_rows {
            Some(rows) => {
                let schema = if rows {
                    clearice_iceberg::dml::count_schema()
                } else {
                    Arc::new(datafusion::arrow::datatypes::Schema::empty())
                };
                let empty = LogicalPlan::EmptyRelation(EmptyRelation {
                    produce_one_row: false,
                    schema: Arc::new(datafusion::common::DFSchema::try_from(
                        schema.as_ref().clone(),
                    )?),
                });
                Ok(datafusion::dataframe::DataFrame::new(
                    self.ctx.state(),
                    empty,
                ))
            }
            None => self.checked(plan).await,
        }
    }

    async fn checked(
        &self,
        plan: datafusion::logical_expr::LogicalPlan,
    ) -> Result<datafusion::dataframe::DataFrame> {
        self.checked_with(plan, vec![]).await
    }

    /// [`Session::checked`], with the table properties of a CREATE TABLE.
    async fn checked_with(
        &self,
        plan: datafusion::logical_expr::LogicalPlan,
        properties: Vec<(String, String)>,
    ) -> Result<datafusion::dataframe::DataFrame> {
        if let Some(e) = &self.setup_error {
            return Err(DataFusionError::Execution(e.clone()));
        }
        if let Some(df) = self.iceberg_ddl(&plan, properties.clone()).await? {
            return Ok(df);
        }
        if !properties.is_empty() {
            return Err(DataFusionError::Plan(
                "table properties (WITH (...) / TBLPROPERTIES) apply to Iceberg catalog tables only".into(),
            ));
        }
        if let Some(c) = &self.confine {
            c.check_plan(&plan).await?;
        }
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

    /// The Iceberg catalog named `name` (`None`: the default catalog), if it is one.
    fn iceberg_catalog(&self, name: Option<&str>) -> Option<&Arc<IcebergCatalogProvider>> {
        let default = self.namespace().0;
        let name = name.unwrap_or(&default);
        self.catalogs.iter().find(|c| c.name() == name)
    }

    /// `catalog.namespace.table` of a table reference, if its catalog is an Iceberg one.
    fn iceberg_table(
        &self,
        r: &datafusion::common::TableReference,
    ) -> Option<(&Arc<IcebergCatalogProvider>, String, String)> {
        let (_, default_schema) = self.namespace();
        let cat = self.iceberg_catalog(r.catalog())?;
        Some((
            cat,
            r.schema().unwrap_or(&default_schema).to_owned(),
            r.table().to_owned(),
        ))
    }

    /// Runs catalog changes on Iceberg catalogs (CREATE/DROP SCHEMA, CREATE TABLE [AS],
    /// DROP TABLE) under the policy's write rules; `None` for any other statement.
    async fn iceberg_ddl(
        &self,
        plan: &datafusion::logical_expr::LogicalPlan,
        properties: Vec<(String, String)>,
    ) -> Result<Option<datafusion::dataframe::DataFrame>> {
        use clearice_access::ddl::Ddl;
        use clearice_iceberg::ddl::split_partitioned;
        use datafusion::common::SchemaReference;
        use datafusion::logical_expr::{DdlStatement, LogicalPlan, LogicalPlanBuilder};
        let LogicalPlan::Ddl(ddl) = plan else {
            return Ok(None);
        };
        let empty = || -> Result<datafusion::dataframe::DataFrame> {
            Ok(datafusion::dataframe::DataFrame::new(
                self.ctx.state(),
                LogicalPlanBuilder::empty(false).build()?,
            ))
        };
        fn runner<'a>(cat: &'a Arc<IcebergCatalogProvider>, access: &'a SessionAccess) -> Ddl<'a> {
            Ddl {
                catalog: cat.as_ref(),
                access,
            }
        }
        match ddl {
            DdlStatement::CreateCatalogSchema(c) => {
                let (cat, ns) = match c.schema_name.split_once('.') {
                    Some((cat, ns)) if self.iceberg_catalog(Some(cat)).is_some() => {
                        (self.iceberg_catalog(Some(cat)), ns)
                    }
                    _ => (self.iceberg_catalog(None), c.schema_name.as_str()),
                };
                let Some(cat) = cat else { return Ok(None) };
                runner(cat, &self.access)
                    .create_schema(ns, c.if_not_exists)
                    .await?;
                Ok(Some(empty()?))
            }
            DdlStatement::DropCatalogSchema(d) => {
                let (cat, ns) = match &d.name {
                    SchemaReference::Bare { schema } => (self.iceberg_catalog(None), schema),
                    SchemaReference::Full { schema, catalog } => {
                        (self.iceberg_catalog(Some(catalog)), schema)
                    }
                };
                let Some(cat) = cat else { return Ok(None) };
                runner(cat, &self.access)
                    .drop_schema(ns, d.if_exists, d.cascade)
                    .await?;
                Ok(Some(empty()?))
            }
            DdlStatement::DropTable(d) => {
                let Some((cat, ns, table)) = self.iceberg_table(&d.name) else {
                    return Ok(None);
                };
                runner(cat, &self.access)
                    .drop_table(&ns, &table, d.if_exists)
                    .await?;
                Ok(Some(empty()?))
            }
            DdlStatement::CreateMemoryTable(c) => {
                let Some((cat, ns, table)) = self.iceberg_table(&c.name) else {
                    return Ok(None);
                };
                let (table, partitioning) = split_partitioned(&table);
                // What the query names is checked before the table is created.
                clearice_access::named::check_named_columns(&c.input)?;
                if c.or_replace {
                    return Err(DataFusionError::NotImplemented(format!(
                        "CREATE OR REPLACE TABLE on Iceberg table '{}.{ns}.{table}' is not supported yet; DROP TABLE, then CREATE TABLE",
                        cat.name()
                    )));
                }
                let with_rows = !matches!(
                    c.input.as_ref(),
                    LogicalPlan::EmptyRelation(e) if !e.produce_one_row
                );
                let arrow = c.input.schema().as_arrow().clone();
                // Like Spark and Trino, CREATE TABLE AS makes every column optional.
                let arrow = if with_rows {
                    datafusion::arrow::datatypes::Schema::new(
                        arrow
                            .fields()
                            .iter()
                            .map(|f| f.as_ref().clone().with_nullable(true))
                            .collect::<Vec<_>>(),
                    )
                } else {
                    arrow
                };
                let ddl = runner(cat, &self.access);
                let created = ddl
                    .create_table(
                        &ns,
                        table,
                        &arrow,
                        partitioning,
                        properties,
                        c.if_not_exists,
                    )
                    .await?;
                if !created || !with_rows {
                    return Ok(Some(empty()?));
                }
                // The rows go in through INSERT: same policy checks, encryption and
                // audit. If they fail, the new table goes again.
                let name = datafusion::common::TableReference::full(
                    cat.name().to_owned(),
                    ns.clone(),
                    table.to_owned(),
                );
                let inserted = async {
                    let provider = self.ctx.table_provider(name.clone()).await?;
                    let insert = LogicalPlanBuilder::insert_into(
                        c.input.as_ref().clone(),
                        name.clone(),
                        datafusion::datasource::provider_as_source(provider),
                        datafusion::logical_expr::dml::InsertOp::Append,
                    )?
                    .build()?;
                    let state = self.ctx.state();
                    clearice_access::write_rules::check_statement(&insert, &|p| state.optimize(p))?;
                    self.ctx.execute_logical_plan(insert).await?.collect().await
                }
                .await;
                match inserted {
                    Ok(batches) => Ok(Some(self.ctx.read_batches(batches)?)),
                    Err(e) => {
                        let ident = iceberg::TableIdent::new(
                            iceberg::NamespaceIdent::from_strs(ns.split('.'))
                                .map_err(|e| DataFusionError::External(Box::new(e)))?,
                            table.to_owned(),
                        );
                        if let Err(d) = cat.iceberg().drop_table(&ident).await {
                            tracing::warn!(table = %name, error = %d, "table of a failed CREATE TABLE AS not dropped");
                        }
                        cat.refresh_now().await;
                        Err(e)
                    }
                }
            }
            _ => Ok(None),
        }
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
    pub fn catalog_names(&self) -> Vec<String> {
        self.ctx.catalog_names()
    }

    /// A catalog as this session's principal sees it (tables under the policy).
    pub fn catalog(&self, name: &str) -> Option<Arc<dyn datafusion::catalog::CatalogProvider>> {
        self.ctx.catalog(name)
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
            && cat.schema(s).is_none()
        {
            return Err(DataFusionError::Plan(format!(
                "schema '{s}' not found in catalog '{cat_name}'"
            )));
        }
        let state = self.ctx.state_ref();
        let mut state = state.write();
        let options = &mut state.config_mut().options_mut().catalog;
        if let Some(c) = catalog {
            options.default_catalog = c.to_owned();
        }
        if let Some(s) = schema {
            options.default_schema = s.to_owned();
        }
        Ok(())
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

    /// Refuses (audited) an ingest into `table` that the principal may neither write nor
    /// create, before a front end reads any of its data: a principal without write
    /// rights cannot make the server buffer anything. [`Session::ingest`] checks the
    /// write again when it runs.
    pub async fn authorize_ingest(&self, table: &datafusion::common::TableReference) -> Result<()> {
        let (catalog, schema) = self.namespace();
        let full = format!(
            "{}.{}.{}",
            table.catalog().unwrap_or(&catalog),
            table.schema().unwrap_or(&schema),
            table.table()
        );
        let policy = self.access.policy();
        let principal = self.principal();
        // A new table is created and then written: without a `write` list of its own,
        // writing it needs `[writes] create`, so this covers both.
        if policy.is_known(principal) && policy.may_write_table(principal, &full) {
            return Ok(());
        }
        let denied = clearice_iceberg::Error::WriteDenied {
            what: format!("ingest into table '{full}'"),
            principal: principal.to_owned(),
            rule: "not in the table's `write` list (or `[writes] create`)".into(),
        };
        let audit = clearice_iceberg::WriteAudit::new("ingest");
        let access = clearice_access::TableAccess {
            table: full.clone(),
            snapshot_id: None,
            columns: vec![],
            allowed: false,
            error: Some(denied.to_string()),
            write: Some(audit),
        };
        let e = DataFusionError::External(Box::new(denied));
        self.pending_audit(
            &query_id(),
            &format!("-- ingest into {table}"),
            vec![access],
        )
        .write(Err(one_line(&e)), None)
        .await
        .map_err(|a| DataFusionError::External(Box::new(a)))?;
        Err(e)
    }

    /// Bulk ingest (Flight SQL `CommandStatementIngest`, ADBC `adbc_ingest`): appends
    /// `batches` to catalog table `table` under the policy's write rules, creating it from
    /// `schema` first if it does not exist and `create` is set; an existing table is
    /// appended to only if `append` is set. Returns the rows written. Audited like SQL.
    pub async fn ingest(
        &self,
        table: &datafusion::common::TableReference,
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
        create: bool,
        append: bool,
    ) -> Result<u64> {
        use datafusion::logical_expr::LogicalPlanBuilder;
        self.refresh_catalogs().await;
        let text = format!("-- ingest into {table}");
        let out = self
            .audited(&text, async move {
                let _permit = self.permit()?;
                let Some((cat, ns, name)) = self.iceberg_table(table) else {
                    return Err(DataFusionError::NotImplemented(format!(
                        "ingest into '{table}': only Iceberg catalog tables take ingests"
                    )));
                };
                let full = datafusion::common::TableReference::full(
                    cat.name().to_owned(),
                    ns.clone(),
                    name.clone(),
                );
                let exists = self
                    .ctx
                    .catalog(cat.name())
                    .and_then(|c| c.schema(&ns))
                    .is_some_and(|s| s.table_exist(&name));
                match (exists, create, append) {
                    (false, false, _) => {
                        return Err(DataFusionError::Plan(format!(
                            "table '{full}' not found (ingest with mode create or create_append creates it)"
                        )));
                    }
                    (true, _, false) => {
                        return Err(DataFusionError::Plan(format!(
                            "table '{full}' already exists (ingest with mode append or create_append adds to it)"
                        )));
                    }
                    (false, true, _) => {
                        let nullable = datafusion::arrow::datatypes::Schema::new(
                            schema
                                .fields()
                                .iter()
                                .map(|f| f.as_ref().clone().with_nullable(true))
                                .collect::<Vec<_>>(),
                        );
                        clearice_access::ddl::Ddl {
                            catalog: cat.as_ref(),
                            access: &self.access,
                        }
                        .create_table(&ns, &name, &nullable, None, vec![], false)
                        .await?;
                    }
                    (true, _, true) => {}
                }
                let rows = datafusion::datasource::MemTable::try_new(schema, vec![batches])?;
                let input = LogicalPlanBuilder::scan(
                    "ingest",
                    datafusion::datasource::provider_as_source(Arc::new(rows)),
                    None,
                )?
                .build()?;
                let provider = self.ctx.table_provider(full.clone()).await?;
                let insert = LogicalPlanBuilder::insert_into(
                    input,
                    full,
                    datafusion::datasource::provider_as_source(provider),
                    datafusion::logical_expr::dml::InsertOp::Append,
                )?
                .build()?;
                collect(self.checked(insert).await?).await
            })
            .await?;
        Ok(reported_count(&out))
    }

    /// Runs a parsed statement (no round trip through SQL text), auditing table access.
    pub async fn execute(&self, stmt: Statement) -> Result<QueryOutput> {
        self.refresh_catalogs().await;
        let text = stmt.to_string();
        self.audited(&text, async move {
            let _permit = self.permit()?;
            collect(self.statement_plan(stmt, None).await?).await
        })
        .await
    }

    async fn audited(
        &self,
        sql: &str,
        run: impl Future<Output = Result<QueryOutput>>,
    ) -> Result<QueryOutput> {
        let query = QueryAccess::default();
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
        self.write_audit(&id, sql, query.take(), &result).await?;
        result
    }

    async fn write_audit(
        &self,
        id: &str,
        sql: &str,
        accesses: Vec<clearice_access::TableAccess>,
        result: &Result<QueryOutput>,
    ) -> Result<()> {
        let (outcome, event) = match result {
            Ok(o) => (Ok(o.rows() as u64), None),
            Err(e) => (Err(one_line(e)), event_of(e)),
        };
        let pending = self.pending_audit(id, sql, accesses);
        pending
            .write(outcome, event)
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))
    }

    fn pending_audit(
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
        }
    }

    /// Plans SQL without running it (result schema, parameter types). Only refusals are
    /// audited (a hidden table, an unknown principal): a plan reads no data.
    pub async fn sql_plan(&self, sql: &str) -> Result<datafusion::dataframe::DataFrame> {
        self.refresh_catalogs().await;
        let query = QueryAccess::default();
        let planned = query
            .scope(async {
                match self.timeout() {
                    Some(limit) => {
                        tokio::time::timeout(limit, contained(self.plan_for_schema(sql)))
                            .await
                            .unwrap_or_else(|_| {
                                Err(DataFusionError::External(Box::new(
                                    LimitExceeded::Timeout { limit },
                                )))
                            })
                    }
                    None => contained(self.plan_for_schema(sql)).await,
                }
            })
            .await;
        let accesses = query.take();
        // Every Flight query is planned once before it runs: no audit work unless refused.
        if let Err(e) = &planned
            && (accesses.iter().any(|a| !a.allowed) || event_of(e).is_some())
        {
            self.pending_audit(&query_id(), sql, accesses)
                .write(Err(one_line(e)), event_of(e))
                .await
                .map_err(|a| DataFusionError::External(Box::new(a)))?;
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
        self.start_stream(&text, async { self.statement_plan(stmt, None).await })
            .await
    }

    async fn start_stream(
        &self,
        sql: &str,
        planned: impl Future<Output = Result<datafusion::dataframe::DataFrame>>,
    ) -> Result<SendableRecordBatchStream> {
        self.refresh_catalogs().await;
        let query = QueryAccess::default();
        let id = query_id();
        let deadline = self.timeout().map(|d| (tokio::time::Instant::now() + d, d));
        let started = contained(async {
            let permit = self.permit()?;
            let df = planned.await?;
            let announced = Arc::new(df.schema().as_arrow().clone());
            Ok((
                with_types_of(&announced, df.execute_stream().await?)?,
                permit,
            ))
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
        let pending = self.pending_audit(&id, sql, query.take());
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

/// Audit records of one query, written when its outcome is known.
struct PendingAudit {
    accesses: Vec<clearice_access::TableAccess>,
    log: Option<Arc<AuditLog>>,
    caller: Caller,
    query_id: String,
    sql_sha256: String,
}

impl PendingAudit {
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
        if let Some((action, resource)) = event {
            out.push(AuditRecord {
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
            });
        }
        out
    }

    /// Writes the records and waits for the audit writer to confirm them.
    async fn write(
        mut self,
        outcome: std::result::Result<u64, String>,
        event: Option<(String, String)>,
    ) -> std::result::Result<(), crate::audit::AuditError> {
        let Some(log) = self.log.take() else {
            return Ok(());
        };
        log.write_all(&self.records(outcome, event)).await
    }
}

/// A result stream that writes its query's audit records when it ends: at the end (or
/// the first error) it waits for the audit writer before passing the end (or error) on;
/// dropped early, it hands the records over without waiting.
struct AuditedStream {
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
    fn new(inner: SendableRecordBatchStream, pending: PendingAudit) -> Self {
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
        if let Some(mut p) = self.pending.take()
            && let Some(log) = p.log.take()
        {
            log.write_detached(
                &p.records(Err("cancelled: the client stopped reading".into()), None),
            );
        }
    }
}

async fn collect(df: datafusion::dataframe::DataFrame) -> Result<QueryOutput> {
    // The executed plan's schema (what the batches carry), not the logical one.
    let stream = df.execute_stream().await?;
    let schema = stream.schema();
    let batches = stream.try_collect().await?;
    Ok(QueryOutput { schema, batches })
}

/// A CREATE TABLE without its `WITH (k = v, ...)` / `TBLPROPERTIES (...)` (DataFusion
/// plans none), and those properties.
fn take_table_properties(mut stmt: Statement) -> Result<(Statement, Vec<(String, String)>)> {
    use datafusion::sql::sqlparser::ast::{self, CreateTableOptions, SqlOption};
    let Statement::Statement(s) = &mut stmt else {
        return Ok((stmt, vec![]));
    };
    let ast::Statement::CreateTable(ct) = s.as_mut() else {
        return Ok((stmt, vec![]));
    };
    let options = match std::mem::take(&mut ct.table_options) {
        CreateTableOptions::None => return Ok((stmt, vec![])),
        CreateTableOptions::With(o) | CreateTableOptions::TableProperties(o) => o,
        other => {
            return Err(DataFusionError::NotImplemented(format!(
                "table options {other}: use WITH (name = 'value', ...) or TBLPROPERTIES"
            )));
        }
    };
    let mut out = Vec::new();
    for o in options {
        let SqlOption::KeyValue { key, value } = o else {
            return Err(DataFusionError::Plan(format!(
                "table property '{o}' is not name = 'value'"
            )));
        };
        let value = match value {
            ast::Expr::Value(v) => match v.value {
                ast::Value::SingleQuotedString(s) | ast::Value::DoubleQuotedString(s) => s,
                ast::Value::Number(n, _) => n,
                ast::Value::Boolean(b) => b.to_string(),
                other => other.to_string(),
            },
            ast::Expr::Identifier(i) => i.value,
            other => other.to_string(),
        };
        out.push((key.value, value));
    }
    Ok((stmt, out))
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

/// The ALTER TABLE statement `stmt` is, if it is one.
fn alter_of(stmt: &Statement) -> Option<&datafusion::sql::sqlparser::ast::AlterTable> {
    match stmt {
        Statement::Statement(s) => match s.as_ref() {
            datafusion::sql::sqlparser::ast::Statement::AlterTable(a) => Some(a),
            _ => None,
        },
        _ => None,
    }
}

/// The MERGE statement `stmt` is, if it is one.
fn merge_of(stmt: &Statement) -> Option<&datafusion::sql::sqlparser::ast::Merge> {
    match stmt {
        Statement::Statement(s) => match s.as_ref() {
            datafusion::sql::sqlparser::ast::Statement::Merge(m) => Some(m),
            _ => None,
        },
        _ => None,
    }
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

/// The audit action and resource of a statement stopped by confinement or a limit.
fn event_of(e: &DataFusionError) -> Option<(String, String)> {
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
