//! The Iceberg table provider: plans data files with Iceberg (manifest and partition
//! pruning), scans them with DataFusion's Parquet reader in parallel, decrypting each
//! file through the PME encryption factory and resolving columns by field id.

use std::any::Any;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::config::TableParquetOptions;
use datafusion::common::stats::Precision;
use datafusion::common::{DFSchema, Statistics, project_schema};
use datafusion::datasource::TableType;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfigBuilder, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result as DfResult;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::logical_expr::expr_rewriter::unnormalize_col;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::empty::EmptyExec;
use futures::TryStreamExt;
use iceberg::scan::FileScanTask;
use iceberg::table::Table;
use object_store::ObjectStore;

use clearice_crypto::{CallContext, KeyScope, ProviderRef};

use crate::error::{Error, Result};
use crate::field_id::FieldIdExprAdapterFactory;
use crate::filter::to_iceberg_predicate;
use crate::pme::{DecryptingReaderFactory, ScanKeys};
use crate::schema::arrow_schema;
use crate::storage::{CATALOG_S3_SCHEME, LakeStores, Location, S3Options};

/// Object store URL that Iceberg data files are read through: a local filesystem store
/// the engine registers under this name, apart from `file://`, so sessions whose
/// `file://` is confined to file areas still read catalog data.
pub const CATALOG_STORE_URL: &str = "clearice-catalog://local";

/// Who a scan runs as and which keys it may request.
#[derive(Debug, Clone)]
pub struct ScanAs<'a> {
    /// Keys the scan may request.
    pub scope: KeyScope,
    /// The principal (sent to the crypto provider).
    pub principal: &'a str,
    /// AAD prefix for files that do not store theirs (policy `aad_prefix`).
    pub aad_prefix: Option<Vec<u8>>,
    /// The provider of this table's keys (policy `provider`); `None`: the catalog's.
    pub provider: Option<ProviderRef>,
    /// The principal's own provider token.
    pub credential: Option<clearice_crypto::AccessToken>,
}

/// A table of an Iceberg catalog, at its current snapshot.
#[derive(Clone)]
pub struct IcebergTableProvider {
    name: String,
    table: Table,
    schema: SchemaRef,
    crypto: ProviderRef,
    stores: LakeStores,
    /// S3 options with the table's FileIO properties (a REST catalog's table config,
    /// vended credentials) merged in.
    s3: S3Options,
}

impl std::fmt::Debug for IcebergTableProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IcebergTableProvider")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl IcebergTableProvider {
    /// Wraps a loaded table whose files `crypto` decrypts, read from `stores`.
    pub fn try_new(
        name: String,
        table: Table,
        crypto: ProviderRef,
        stores: LakeStores,
    ) -> Result<Self> {
        let schema = arrow_schema(&name, table.metadata().current_schema())?;
        let s3 = stores
            .options()
            .with_catalog_props(table.file_io().config().props());
        Ok(Self {
            name,
            table,
            schema,
            crypto,
            stores,
            s3,
        })
    }

    /// `catalog.namespace.table`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Application context sent to crypto providers: table, namespace, schema id and
    /// snapshot id.
    pub fn application_context(&self) -> std::collections::BTreeMap<String, String> {
        let m = self.table.metadata();
        let mut app = std::collections::BTreeMap::from([
            ("table".to_owned(), self.name.clone()),
            (
                "namespace".to_owned(),
                self.table.identifier().namespace().to_url_string(),
            ),
            ("schema_id".to_owned(), m.current_schema_id().to_string()),
        ]);
        if let Some(s) = m.current_snapshot() {
            app.insert("snapshot_id".into(), s.snapshot_id().to_string());
        }
        app
    }

    /// The Iceberg table.
    pub fn table(&self) -> &Table {
        &self.table
    }

    async fn plan_files(&self, filters: &[Expr]) -> Result<Vec<FileScanTask>> {
        let err = |source: iceberg::Error| Error::Iceberg {
            table: self.name.clone(),
            source: Box::new(source),
        };
        let mut scan = self.table.scan().select_all();
        if let Some(p) = to_iceberg_predicate(filters, self.table.metadata().current_schema()) {
            scan = scan.with_filter(p);
        }
        let tasks: Vec<FileScanTask> = scan
            .build()
            .map_err(err)?
            .plan_files()
            .await
            .map_err(err)?
            .try_collect()
            .await
            .map_err(err)?;
        if let Some(t) = tasks.iter().find(|t| !t.deletes.is_empty()) {
            return Err(Error::DeletesNotSupported {
                table: self.name.clone(),
                snapshot_id: self
                    .table
                    .metadata()
                    .current_snapshot_id()
                    .unwrap_or_default(),
                file: t.deletes[0].file_path.clone(),
            });
        }
        Ok(tasks)
    }

    /// The store URL a data file is scanned through, its path there, and the name of
    /// the file in messages and provider calls.
    fn object_path(&self, location: &str) -> Result<(ObjectStoreUrl, String, String)> {
        let loc = Location::parse(location).map_err(|e| Error::UnsupportedLocation {
            table: self.name.clone(),
            location: location.to_owned(),
            reason: e.to_string(),
        })?;
        let path = loc.object_path().to_string();
        Ok(match loc {
            Location::Local(p) => (
                ObjectStoreUrl::parse(CATALOG_STORE_URL).expect("static URL"),
                path,
                p,
            ),
            Location::S3 { bucket, key } => (
                ObjectStoreUrl::parse(format!("{CATALOG_S3_SCHEME}://{bucket}")).map_err(|e| {
                    Error::UnsupportedLocation {
                        table: self.name.clone(),
                        location: location.to_owned(),
                        reason: e.to_string(),
                    }
                })?,
                path,
                format!("s3://{bucket}/{key}"),
            ),
        })
    }

    /// The store a data file is read from (with the table's own S3 options).
    fn store_of(&self, location: &str) -> Result<Arc<dyn ObjectStore>> {
        self.stores
            .resolve_with(location, &self.s3)
            .map(|(store, _)| store)
            .map_err(|e| Error::Storage {
                table: self.name.clone(),
                source: Box::new(e),
            })
    }
}

/// Splits files into at most `n` groups of similar byte size (largest first).
fn split_groups(mut files: Vec<PartitionedFile>, n: usize) -> Vec<FileGroup> {
    let n = n.max(1).min(files.len().max(1));
    files.sort_by_key(|f| std::cmp::Reverse(f.object_meta.size));
    let mut groups: Vec<(u64, Vec<PartitionedFile>)> = (0..n).map(|_| (0, Vec::new())).collect();
    for f in files {
        let g = groups.iter_mut().min_by_key(|g| g.0).expect("n >= 1");
        g.0 += f.object_meta.size;
        g.1.push(f);
    }
    groups
        .into_iter()
        .filter(|g| !g.1.is_empty())
        .map(|g| FileGroup::new(g.1))
        .collect()
}

#[async_trait::async_trait]
impl TableProvider for IcebergTableProvider {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DfResult<Vec<TableProviderFilterPushDown>> {
        // Used for Iceberg file pruning only; DataFusion still evaluates every filter
        // (and pushes it into the Parquet scan itself).
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let keys = ScanAs {
            scope: KeyScope::All,
            principal: "",
            aad_prefix: None,
            provider: None,
            credential: None,
        };
        self.scan_with(state, projection, filters, limit, keys, false)
            .await
    }
}

impl IcebergTableProvider {
    /// Scans as `keys.principal` with keys limited to `keys.scope`. With `set_predicate`, `filters` (which must
    /// only name columns the principal may see in plaintext) are also given to the
    /// Parquet reader, for use when a node above blocks DataFusion's own pushdown.
    pub async fn scan_with(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
        keys: ScanAs<'_>,
        set_predicate: bool,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        if self.table.metadata().current_snapshot().is_none() {
            return Ok(Arc::new(EmptyExec::new(project_schema(
                &self.schema,
                projection,
            )?)));
        }
        let tasks = self.plan_files(filters).await?;
        if tasks.is_empty() {
            return Ok(Arc::new(EmptyExec::new(project_schema(
                &self.schema,
                projection,
            )?)));
        }
        let mut store_url = None;
        let mut files = Vec::with_capacity(tasks.len());
        for t in &tasks {
            let (url, path, _) = self.object_path(&t.data_file_path)?;
            if store_url.get_or_insert_with(|| url.clone()) != &url {
                return Err(Error::UnsupportedLocation {
                    table: self.name.clone(),
                    location: t.data_file_path.clone(),
                    reason: "data files span several object stores".into(),
                }
                .into());
            }
            let mut f = PartitionedFile::new(path, t.file_size_in_bytes);
            if let Some(n) = t.record_count {
                let mut stats = Statistics::new_unknown(&self.schema);
                stats.num_rows = Precision::Exact(n as usize);
                f = f.with_statistics(Arc::new(stats));
            }
            files.push(f);
        }
        let options = state.config_options();
        let first = &tasks[0].data_file_path;
        let store = self.store_of(first)?;
        // DataFusion looks the scan's store URL up before opening files, although our
        // reader factory reads through `store`. With credentials vended by the catalog
        // (and none configured), only the table's store can be built: register it.
        let url = store_url.as_ref().expect("non-empty");
        if state.runtime_env().object_store(url).is_err() {
            state
                .runtime_env()
                .register_object_store(url.as_ref(), Arc::clone(&store));
        }
        let (_, first_path, first_name) = self.object_path(first)?;
        let prefix = first_name
            .strip_suffix(&first_path)
            .unwrap_or("/")
            .to_owned();
        let keys = ScanKeys {
            provider: keys.provider.unwrap_or_else(|| Arc::clone(&self.crypto)),
            scope: keys.scope,
            context: CallContext {
                principal: keys.principal.to_owned(),
                file: String::new(),
                application: self.application_context(),
                credential: keys.credential,
            },
            aad_prefix: keys.aad_prefix,
            given: None,
        };
        // The decrypting reader decrypts only the page index of columns this scan may
        // read (others get a stand-in), so the page index is on, as for plaintext files.
        let source = ParquetSource::new(Arc::clone(&self.schema))
            .with_parquet_file_reader_factory(Arc::new(
                DecryptingReaderFactory::new(store, keys).with_file_prefix(prefix),
            ))
            .with_table_parquet_options(TableParquetOptions {
                global: options.execution.parquet.clone(),
                ..Default::default()
            });
        let source = match conjunction(filters.iter().cloned().map(unnormalize_col)) {
            Some(expr) if set_predicate => {
                let df_schema = DFSchema::try_from(self.schema.as_ref().clone())?;
                source.with_predicate(state.create_physical_expr(expr, &df_schema)?)
            }
            _ => source,
        };
        // Iceberg's record counts are exact (no delete files): `count(*)` needs no IO.
        let mut table_stats = Statistics::new_unknown(&self.schema);
        if let Some(n) = tasks.iter().map(|t| t.record_count).sum::<Option<u64>>() {
            table_stats.num_rows = Precision::Exact(n as usize);
        }
        let groups = split_groups(files, options.execution.target_partitions);
        let config = FileScanConfigBuilder::new(store_url.expect("non-empty"), Arc::new(source))
            .with_statistics(table_stats)
            .with_file_groups(groups)
            .with_projection_indices(projection.cloned())?
            .with_limit(if filters.is_empty() { limit } else { None })
            .with_expr_adapter(Some(Arc::new(FieldIdExprAdapterFactory)))
            .build();
        Ok(DataSourceExec::from_data_source(config))
    }
}
