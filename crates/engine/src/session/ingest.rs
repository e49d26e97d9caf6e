//! Bulk ingest of a session (Flight SQL `DoPut`): authorized before a byte is read, then written under the policy.

use super::*;

impl Session {
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
            row_filter: None,
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
                        .create_table(&ns, &name, &nullable, &[], vec![], false)
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
                collect(self.checked(insert, CreateOptions::default()).await?).await
            })
            .await?;
        Ok(reported_count(&out))
    }
}
