//! DDL and MERGE of a session: ALTER TABLE, Iceberg CREATE/DROP (with PARTITIONED BY and table properties), MERGE INTO, each under the policy.

use super::*;

impl Session {
    /// `ALTER TABLE` of an Iceberg table (`None` for other tables: DataFusion's answer).
    pub(super) async fn alter_table(
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
    pub(super) async fn merge(
        &self,
        state: &datafusion::execution::SessionState,
        m: &datafusion::sql::sqlparser::ast::Merge,
    ) -> Result<u64> {
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
        let source = state
            .statement_to_plan(clearice_iceberg::sql::select_star_from(m.source.clone())?)
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
        Box::pin(clearice_access::merge::merge(state, target, m)).await
    }

    /// The Iceberg catalog named `name` (`None`: the default catalog), if it is one.
    pub(super) fn iceberg_catalog(
        &self,
        name: Option<&str>,
    ) -> Option<&Arc<IcebergCatalogProvider>> {
        let default = self.namespace().0;
        let name = name.unwrap_or(&default);
        self.catalogs.iter().find(|c| c.name() == name)
    }

    /// `catalog.namespace.table` of a table reference, if its catalog is an Iceberg one.
    pub(super) fn iceberg_table(
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

    /// Refuses session objects named into an Iceberg catalog, which holds Iceberg tables
    /// only: an external table (a session's table over files) or a view there would
    /// otherwise fail with DataFusion's "does not support registering tables".
    pub(super) fn check_session_objects(
        &self,
        plan: &datafusion::logical_expr::LogicalPlan,
    ) -> Result<()> {
        use datafusion::logical_expr::{DdlStatement, LogicalPlan};
        match plan {
            LogicalPlan::Ddl(DdlStatement::CreateExternalTable(c)) => {
                match self.iceberg_table(&c.name) {
                    Some((cat, ns, table)) => Err(DataFusionError::Plan(format!(
                        "CREATE EXTERNAL TABLE '{}.{ns}.{table}': external tables are session tables of catalog '{SCRATCH_CATALOG}' (name it {SCRATCH_CATALOG}.public.{table}); Iceberg tables are made with CREATE TABLE",
                        cat.name()
                    ))),
                    None => Ok(()),
                }
            }
            LogicalPlan::Ddl(DdlStatement::CreateView(v)) => match self.iceberg_table(&v.name) {
                Some((cat, ns, view)) => Err(DataFusionError::NotImplemented(format!(
                    "CREATE VIEW '{}.{ns}.{view}': views in Iceberg catalogs are not supported yet (create a table, or a session view in catalog '{SCRATCH_CATALOG}')",
                    cat.name()
                ))),
                None => Ok(()),
            },
            _ => Ok(()),
        }
    }

    /// Runs catalog changes on Iceberg catalogs (CREATE/DROP SCHEMA, CREATE TABLE [AS],
    /// DROP TABLE) under the policy's write rules; `None` for any other statement.
    pub(super) async fn iceberg_ddl(
        &self,
        plan: &datafusion::logical_expr::LogicalPlan,
        options: CreateOptions,
    ) -> Result<Option<datafusion::dataframe::DataFrame>> {
        use clearice_access::ddl::Ddl;
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
                    // `other.x` of a catalog that is not an Iceberg one is DataFusion's (and
                    // refused to confined sessions), not a namespace "other.x" of the default.
                    Some(_) => return Ok(None),
                    None => (self.iceberg_catalog(None), c.schema_name.as_str()),
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
                let table = table.as_str();
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
                        &options.partitioning,
                        options.properties,
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
}

/// What a CREATE TABLE says besides its columns and query, for Iceberg tables.
#[derive(Debug, Default, Clone)]
pub(super) struct CreateOptions {
    /// `WITH (name = 'value', ...)` / `TBLPROPERTIES`.
    pub(super) properties: Vec<(String, String)>,
    /// `PARTITIONED BY (...)` terms.
    pub(super) partitioning: Vec<clearice_iceberg::ddl::PartitionTerm>,
}

/// Takes the table properties and `PARTITIONED BY` terms out of a CREATE TABLE
/// (DataFusion's planner refuses both).
pub(super) fn take_table_options(mut stmt: Statement) -> Result<(Statement, CreateOptions)> {
    use datafusion::sql::sqlparser::ast::{self, CreateTableOptions, SqlOption};
    let Statement::Statement(s) = &mut stmt else {
        return Ok((stmt, CreateOptions::default()));
    };
    let ast::Statement::CreateTable(ct) = s.as_mut() else {
        return Ok((stmt, CreateOptions::default()));
    };
    let partitioning = match ct.partition_by.take() {
        Some(clause) => clearice_iceberg::ddl::partition_terms(&clause)
            .map_err(|e| DataFusionError::Plan(format!("CREATE TABLE {}: {e}", ct.name)))?,
        None => vec![],
    };
    let options = match std::mem::take(&mut ct.table_options) {
        CreateTableOptions::None => vec![],
        CreateTableOptions::With(o) | CreateTableOptions::TableProperties(o) => o,
        other => {
            return Err(DataFusionError::NotImplemented(format!(
                "table options {other}: use WITH (name = 'value', ...) or TBLPROPERTIES"
            )));
        }
    };
    let mut properties = Vec::new();
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
        properties.push((key.value, value));
    }
    Ok((
        stmt,
        CreateOptions {
            properties,
            partitioning,
        },
    ))
}

/// The ALTER TABLE statement `stmt` is, if it is one.
pub(super) fn alter_of(stmt: &Statement) -> Option<&datafusion::sql::sqlparser::ast::AlterTable> {
    match stmt {
        Statement::Statement(s) => match s.as_ref() {
            datafusion::sql::sqlparser::ast::Statement::AlterTable(a) => Some(a),
            _ => None,
        },
        _ => None,
    }
}

/// The MERGE statement `stmt` is, if it is one.
pub(super) fn merge_of(stmt: &Statement) -> Option<&datafusion::sql::sqlparser::ast::Merge> {
    match stmt {
        Statement::Statement(s) => match s.as_ref() {
            datafusion::sql::sqlparser::ast::Statement::Merge(m) => Some(m),
            _ => None,
        },
        _ => None,
    }
}
