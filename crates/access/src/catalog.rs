//! Catalogs as one session's principal sees them: hidden tables are absent (and their
//! lookups audited), every table is a [`PolicyTableProvider`], metadata tables show only
//! what the principal may read.

use std::any::Any;
use std::sync::Arc;

use clearice_iceberg::AsOf;
use clearice_iceberg::travel::split_name;
use clearice_iceberg::{IcebergCatalogProvider, IcebergSchemaProvider, metadata_table, unreadable};
use clearice_policy::TableDecision;
use datafusion::catalog::{CatalogProvider, SchemaProvider, TableProvider};
use datafusion::error::Result as DfResult;

use crate::access::{SessionAccess, TableAccess};
use crate::policy_provider::PolicyTableProvider;

/// A catalog as one session's principal sees it: every table goes through the policy.
#[derive(Debug)]
pub struct SessionCatalogProvider {
    inner: Arc<IcebergCatalogProvider>,
    access: Arc<SessionAccess>,
}

impl SessionCatalogProvider {
    /// Wraps a shared catalog for one session.
    pub fn new(inner: Arc<IcebergCatalogProvider>, access: Arc<SessionAccess>) -> Self {
        Self { inner, access }
    }

    /// The table `schema.name` (`t$files`: a metadata table) as of a snapshot, as the
    /// session's principal sees it; `None`: no such table, or hidden from the principal.
    pub async fn table_as_of(
        &self,
        schema: &str,
        name: &str,
        as_of: &AsOf,
    ) -> DfResult<Option<Arc<dyn TableProvider>>> {
        let Some(inner) = self.inner.schema_provider(schema) else {
            return Ok(None);
        };
        SessionSchemaProvider {
            inner,
            access: Arc::clone(&self.access),
        }
        .open(name, Some(as_of))
        .await
    }
}

impl CatalogProvider for SessionCatalogProvider {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema_names(&self) -> Vec<String> {
        self.inner.schema_names()
    }

    /// A namespace the catalog does not have resolves as an empty schema (not listed):
    /// a session whose default schema is not in its default catalog still reads files by
    /// path, and names in it fail as "table not found".
    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        let Some(inner) = self.inner.schema_provider(name) else {
            return Some(Arc::new(AbsentSchema));
        };
        Some(Arc::new(SessionSchemaProvider {
            inner,
            access: Arc::clone(&self.access),
        }))
    }
}

/// A schema an Iceberg catalog does not have: no tables, and none can be registered in it
/// (DataFusion's default `register_table` refuses).
#[derive(Debug)]
struct AbsentSchema;

#[async_trait::async_trait]
impl SchemaProvider for AbsentSchema {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn table_names(&self) -> Vec<String> {
        Vec::new()
    }

    async fn table(&self, _name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        Ok(None)
    }

    fn table_exist(&self, _name: &str) -> bool {
        false
    }
}

/// A namespace as one session's principal sees it.
#[derive(Debug)]
pub struct SessionSchemaProvider {
    inner: Arc<IcebergSchemaProvider>,
    access: Arc<SessionAccess>,
}

#[async_trait::async_trait]
impl SchemaProvider for SessionSchemaProvider {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn table_names(&self) -> Vec<String> {
        // A principal the policy does not know may not read any table: list none.
        if !self.access.policy().is_known(self.access.principal()) {
            return vec![];
        }
        self.inner
            .table_names()
            .into_iter()
            .filter(|t| !self.is_hidden(t))
            .collect()
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        self.open(name, None).await
    }

    fn table_exist(&self, name: &str) -> bool {
        self.inner.table_exist(name) && !self.is_hidden(name)
    }
}

impl SessionSchemaProvider {
    /// The table `name` (`t$files`: a metadata table of `t`) as the principal sees it, as
    /// of a snapshot if `as_of` says so; `None` if it does not exist or is hidden.
    pub async fn open(
        &self,
        name: &str,
        as_of: Option<&AsOf>,
    ) -> DfResult<Option<Arc<dyn TableProvider>>> {
        if self.is_hidden(name) {
            // As for a table that does not exist, so the name leaks nothing; audited.
            if self.inner.table_exist(name) {
                let table = self.inner.full_name(split_name(name).0);
                let (_, rule) = self
                    .access
                    .policy()
                    .table_access(self.access.principal(), &table);
                self.access.record(TableAccess {
                    row_filter: None,
                    write: None,
                    table,
                    snapshot_id: None,
                    columns: vec![],
                    allowed: false,
                    error: Some(format!("table hidden from principal (rule: {rule})")),
                });
            }
            return Ok(None);
        }
        let (base, metadata) = split_name(name);
        let t = match self.inner.load(name, as_of).await {
            Err(e) => return unreadable(e),
            Ok(None) => return Ok(None),
            Ok(Some(t)) => t,
        };
        let policy = PolicyTableProvider::try_new(t, Arc::clone(&self.access)).await?;
        if let Some(kind) = metadata {
            // A metadata table shows what the table's columns would: nothing of a denied
            // table, no statistics of a column not readable in plaintext.
            policy.check_readable(&self.inner.full_name(base))?;
            self.access.record(TableAccess {
                row_filter: None,
                write: None,
                table: format!("{}${}", self.inner.full_name(base), kind.name()),
                snapshot_id: policy.inner().snapshot().map(|s| s.snapshot_id()),
                columns: vec![],
                allowed: true,
                error: None,
            });
            let plaintext = |c: &str| policy.is_plaintext(c);
            return Ok(Some(
                metadata_table(policy.inner(), kind, &plaintext).await?,
            ));
        }
        Ok(Some(Arc::new(policy)))
    }

    fn is_hidden(&self, name: &str) -> bool {
        let table = self.inner.full_name(split_name(name).0);
        self.access
            .policy()
            .table_access(self.access.principal(), &table)
            .0
            == TableDecision::Hide
    }
}
