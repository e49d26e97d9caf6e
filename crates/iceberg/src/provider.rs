//! The Iceberg table provider: plans data files with Iceberg (manifest and partition
//! pruning), scans them with DataFusion's Parquet reader in parallel, decrypting each
//! file through the PME encryption factory and resolving columns by field id.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Schema, SchemaRef};
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::config::TableParquetOptions;
use datafusion::common::stats::Precision;
use datafusion::common::{DFSchema, Statistics};
use datafusion::datasource::TableType;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfigBuilder, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::logical_expr::expr_rewriter::unnormalize_col;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::union::UnionExec;
use futures::{FutureExt, StreamExt, TryStreamExt};
use iceberg::scan::FileScanTask;
use iceberg::spec::SnapshotRef;
use iceberg::table::Table;
use object_store::ObjectStore;

use clearice_crypto::{KeyScope, ProviderRef, ScanGrant};

use crate::deletes::{
    Deletes, FileReading, IcebergDeletesExec, LOAD_CONCURRENCY, column_of, widen,
};
use crate::error::{Error, Result};
use crate::field_id::FieldIdExprAdapterFactory;
use crate::filter::to_iceberg_predicate;
use crate::restrictions::{LoadedRestrictions, Refused, RestRestrictions};
use crate::schema::arrow_schema;

mod data_scan;
pub use crate::snapshot_exec::IcebergSnapshotExec;
pub use crate::statistics::Shown;
pub use crate::travel::AsOf;
pub(crate) use crate::travel::{format_ms, listing, refs_of};
use clearice_pme::{DecryptingReaderFactory, FileKeys, ScanKeys};
use clearice_storage::{CATALOG_S3_SCHEME, LakeStores, Location, S3Options};
use data_scan::ScanFile;

/// Object store URL that Iceberg data files are read through: a local filesystem store
/// the engine registers under this name, apart from `file://`, so sessions whose
/// `file://` is confined to file areas still read catalog data.
pub const CATALOG_STORE_URL: &str = "clearice-catalog://local";

/// The column a rewrite scan adds: each row's data file.
pub const FILE_COLUMN: &str = "_file";

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
    /// The snapshot scanned (the current one unless the query travelled in time).
    snapshot: Option<SnapshotRef>,
    /// How the query named the snapshot (`FOR VERSION AS OF ...`), if it did.
    as_of: Option<AsOf>,
    /// The catalog the table was loaded from (writes commit there).
    catalog: Option<Arc<dyn iceberg::Catalog>>,
    /// Takes the catalog's commits that remove files.
    committer: Option<crate::commit::Committer>,
    /// Scan only these data files (paths), if set (row-level writes rewrite them).
    only_files: Option<Arc<std::collections::HashSet<String>>>,
    /// Add the data file's path to every row as column `_file` (row-level writes).
    file_column: bool,
    /// Add each row's lineage, `_row_id` and `_last_updated_sequence_number` (a format
    /// v3 table's rewrite scan, see `lineage.rs`).
    lineage: bool,
    /// File groups per data scan, if not the session's `target_partitions` (a scan
    /// planned for workers).
    split: Option<usize>,
    /// Its REST catalog's read restrictions and its name there (namespace, table).
    restrictions: Option<(Arc<RestRestrictions>, Vec<String>, String)>,
    /// Which column statistics its scans' plans carry.
    shown: Shown,
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
        let snapshot = table.metadata().current_snapshot().cloned();
        Ok(Self {
            name,
            table,
            schema,
            crypto,
            stores,
            s3,
            snapshot,
            as_of: None,
            catalog: None,
            committer: None,
            only_files: None,
            file_column: false,
            lineage: false,
            split: None,
            restrictions: None,
            shown: Shown::default(),
        })
    }

    /// With the catalog the table was loaded from, so SQL writes can commit to it.
    pub fn with_catalog(
        mut self,
        catalog: Arc<dyn iceberg::Catalog>,
        committer: crate::commit::Committer,
    ) -> Self {
        self.catalog = Some(catalog);
        self.committer = Some(committer);
        self
    }

    /// Its scans' plans carry statistics as `shown` says (the access layer: the columns
    /// the principal reads in plaintext).
    pub fn with_shown_statistics(mut self, shown: Shown) -> Self {
        self.shown = shown;
        self
    }

    /// Has its REST catalog asked for read restrictions (`ident`: the table there).
    pub fn with_restrictions(
        mut self,
        restrictions: Option<Arc<RestRestrictions>>,
        ident: &iceberg::TableIdent,
    ) -> Self {
        self.restrictions = restrictions.map(|r| {
            (
                r,
                ident.namespace().clone().inner(),
                ident.name().to_owned(),
            )
        });
        self
    }

    /// The read restrictions its REST catalog requires for `principal`; `None`: not a
    /// table of a REST catalog asked for them; `Some(Err(_))`: the catalog cannot be asked
    /// for this principal (no token of its own) or refuses it the table.
    pub async fn read_restrictions(
        &self,
        principal: &str,
    ) -> Result<Option<std::result::Result<LoadedRestrictions, Refused>>> {
        let Some((r, namespace, table)) = &self.restrictions else {
            return Ok(None);
        };
        r.load(principal, namespace, table, &self.name)
            .await
            .map(Some)
    }

    /// How the catalog takes commits that remove files, if known.
    pub fn committer(&self) -> Option<&crate::commit::Committer> {
        self.committer.as_ref()
    }

    /// The table restricted to the data files `files` (paths), with their path as a
    /// last column `_file` when `file_column` (what row-level writes scan).
    pub fn for_rewrite(
        &self,
        files: Option<Arc<std::collections::HashSet<String>>>,
        file_column: bool,
    ) -> Self {
        let mut t = self.clone();
        t.only_files = files;
        t.file_column = file_column;
        t
    }

    /// This rewrite scan with each row's lineage as columns `_row_id` and
    /// `_last_updated_sequence_number` after the table's (a format v3 table).
    pub fn with_lineage(mut self) -> Self {
        self.lineage = true;
        self
    }

    /// Whether rows this table's writes copy must keep their lineage (format v3).
    pub fn tracks_lineage(&self) -> bool {
        self.table.metadata().format_version() >= iceberg::spec::FormatVersion::V3
    }

    /// The `_file` column of a rewrite scan.
    fn file_field() -> datafusion::arrow::datatypes::FieldRef {
        Arc::new(datafusion::arrow::datatypes::Field::new(
            FILE_COLUMN,
            DataType::Utf8,
            false,
        ))
    }

    /// The table's columns (without a rewrite scan's `_file`).
    pub fn table_schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    /// The scan's schema: the table's, plus the lineage columns and `_file` for a
    /// rewrite scan that adds them.
    fn full_schema(&self) -> SchemaRef {
        let mut fields: Vec<_> = self.file_schema().fields().iter().cloned().collect();
        if self.file_column {
            fields.push(Self::file_field());
        }
        Arc::new(Schema::new(fields))
    }

    /// The columns read from data files: the table's, plus the lineage columns (read
    /// where a file stores them) for a lineage scan.
    fn file_schema(&self) -> SchemaRef {
        if !self.lineage {
            return Arc::clone(&self.schema);
        }
        let mut fields: Vec<_> = self.schema.fields().iter().cloned().collect();
        fields.extend(crate::lineage::fields().map(Arc::new));
        Arc::new(Schema::new(fields))
    }

    /// The catalog the table was loaded from, if known.
    pub fn catalog(&self) -> Option<&Arc<dyn iceberg::Catalog>> {
        self.catalog.as_ref()
    }

    /// Scans planned into `partitions` file groups (a scan planned for workers), not the
    /// session's `target_partitions`.
    pub fn split_into(mut self, partitions: usize) -> Self {
        self.split = Some(partitions);
        self
    }

    /// The table at snapshot `id` with its current schema (what a query that did not
    /// travel in time read when `id` was current).
    pub fn pinned(&self, id: i64) -> Result<Self> {
        let snapshot = self
            .table
            .metadata()
            .snapshot_by_id(id)
            .cloned()
            .ok_or_else(|| Error::SnapshotNotFound {
                table: self.name.clone(),
                reason: format!("no snapshot {id} (expired since the query was planned?)"),
            })?;
        let mut t = self.clone();
        t.snapshot = Some(snapshot);
        Ok(t)
    }

    /// The table as of a snapshot, branch, tag or time, with that snapshot's schema.
    pub fn as_of(mut self, as_of: AsOf) -> Result<Self> {
        let m = self.table.metadata();
        let not_found = |reason: String| Error::SnapshotNotFound {
            table: self.name.clone(),
            reason,
        };
        let snapshot = match &as_of {
            AsOf::Version(id) => m.snapshot_by_id(*id).cloned().ok_or_else(|| {
                let ids = m.snapshots().take(20).map(|s| s.snapshot_id().to_string());
                not_found(format!("no snapshot {id} (snapshots: {})", listing(ids)))
            })?,
            AsOf::Ref(r) => m.snapshot_for_ref(r).cloned().ok_or_else(|| {
                let refs = refs_of(m).into_keys();
                not_found(format!("no branch or tag '{r}' (refs: {})", listing(refs)))
            })?,
            AsOf::Timestamp(ms) => {
                // The snapshot that was current at that time (the snapshot log of main).
                let id = m
                    .history()
                    .iter()
                    .filter(|l| l.timestamp_ms <= *ms)
                    .max_by_key(|l| l.timestamp_ms)
                    .map(|l| l.snapshot_id)
                    .ok_or_else(|| match m.history().iter().map(|l| l.timestamp_ms).min() {
                        Some(first) => not_found(format!(
                            "no snapshot at {} (the first snapshot was committed at {})",
                            format_ms(*ms),
                            format_ms(first)
                        )),
                        None => not_found("the table has no snapshot".into()),
                    })?;
                m.snapshot_by_id(id).cloned().ok_or_else(|| {
                    not_found(format!("snapshot {id} of the table's history is expired"))
                })?
            }
        };
        let schema = snapshot.schema(m).map_err(|source| Error::Iceberg {
            table: self.name.clone(),
            source: Box::new(source),
        })?;
        self.schema = arrow_schema(&self.name, &schema)?;
        self.snapshot = Some(snapshot);
        self.as_of = Some(as_of);
        Ok(self)
    }

    /// The name the table's current schema gives the column `field` (of the scanned
    /// snapshot's schema), by field id: what policy rules name. A column dropped since
    /// keeps its old name.
    pub fn current_name(&self, field: &datafusion::arrow::datatypes::Field) -> String {
        crate::field_id::field_id(field)
            .and_then(|id| {
                self.table
                    .metadata()
                    .current_schema()
                    .name_by_field_id(id)
                    .map(str::to_owned)
            })
            .unwrap_or_else(|| field.name().clone())
    }

    /// The snapshot this provider scans (`None`: the table has none).
    pub fn snapshot(&self) -> Option<&SnapshotRef> {
        self.snapshot.as_ref()
    }

    /// How the query named the snapshot, if it travelled in time.
    pub fn travelled(&self) -> Option<&AsOf> {
        self.as_of.as_ref()
    }

    /// `catalog.namespace.table`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Application context sent to crypto providers: table, namespace, schema id and
    /// snapshot id.
    pub fn application_context(&self) -> BTreeMap<String, String> {
        let m = self.table.metadata();
        let mut app = BTreeMap::from([
            ("table".to_owned(), self.name.clone()),
            (
                "namespace".to_owned(),
                self.table.identifier().namespace().to_url_string(),
            ),
            (
                "schema_id".to_owned(),
                self.snapshot
                    .as_ref()
                    .and_then(|s| s.schema_id())
                    .unwrap_or(m.current_schema_id())
                    .to_string(),
            ),
        ]);
        if let Some(s) = &self.snapshot {
            app.insert("snapshot_id".into(), s.snapshot_id().to_string());
        }
        app
    }

    /// The Iceberg table.
    pub fn table(&self) -> &Table {
        &self.table
    }

    /// The same table, its key encryption keys wrapped and unwrapped by `client` (a
    /// principal's crypto provider that keeps the table key); see
    /// [`crate::native::with_key_client`].
    pub fn with_key_client(
        mut self,
        client: Arc<dyn iceberg::encryption::KeyManagementClient>,
    ) -> Result<Self> {
        self.table = crate::native::with_key_client(&self.table, client).map_err(|source| {
            Error::Iceberg {
                table: self.name.clone(),
                source: Box::new(source),
            }
        })?;
        Ok(self)
    }

    /// The master key id Iceberg encrypts this table under (`encryption.key-id`), if it
    /// encrypts it natively.
    pub fn table_key_id(&self) -> Option<&str> {
        crate::native::table_key_id(self.table.metadata())
    }

    /// Fails if ClearIce cannot run write `action` (`insert`, `delete`, ...) on the table:
    /// a table Iceberg encrypts itself is written only through a catalog ClearIce commits
    /// to (SQL catalogs).
    pub fn check_writable(&self, action: &str) -> Result<()> {
        let statement = action.replace('_', " ").to_uppercase();
        let Some(key) = self.table_key_id() else {
            return Ok(());
        };
        let what = match &self.committer {
            Some(crate::commit::Committer::Sql { .. }) => return Ok(()),
            Some(crate::commit::Committer::Unsupported { reason }) => format!(
                "{statement} on a table Iceberg encrypts itself (table key '{key}') through this catalog ({reason})"
            ),
            None => format!(
                "{statement} on a table Iceberg encrypts itself (table key '{key}') outside a catalog"
            ),
        };
        Err(Error::Unsupported {
            table: self.name.clone(),
            what,
        })
    }

    /// For a natively encrypted table, the key of every live file of the snapshot read,
    /// by path in its store.
    async fn file_keys(&self) -> Result<Option<Arc<FileKeys>>> {
        let (Some(_), Some(snapshot)) = (self.table_key_id(), &self.snapshot) else {
            return Ok(None);
        };
        let by_location = crate::native::file_keys(&self.table, snapshot.snapshot_id())
            .await
            .map_err(|e| match e {
                crate::native::FileKeysError::Tampered(kind, file) => Error::Tampered {
                    table: self.name.clone(),
                    kind: kind.into(),
                    file,
                },
                crate::native::FileKeysError::Other(source) => Error::Iceberg {
                    table: self.name.clone(),
                    source: Box::new(source),
                },
            })?;
        let mut by_path = FileKeys::with_capacity(by_location.len());
        for (location, key) in by_location {
            by_path.insert(self.object_path(&location)?.1, key);
        }
        Ok(Some(Arc::new(by_path)))
    }

    async fn plan_files(&self, filters: &[Expr]) -> Result<Vec<FileScanTask>> {
        let err = |source: iceberg::Error| Error::Iceberg {
            table: self.name.clone(),
            source: Box::new(source),
        };
        let Some(snapshot) = &self.snapshot else {
            return Ok(vec![]);
        };
        let m = self.table.metadata();
        let schema = snapshot.schema(m).map_err(err)?;
        let mut scan = self
            .table
            .scan()
            .snapshot_id(snapshot.snapshot_id())
            .select_all();
        if let Some(p) = to_iceberg_predicate(filters, &schema) {
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
        if let Some(t) = tasks
            .iter()
            .find(|t| t.data_file_format != iceberg::spec::DataFileFormat::Parquet)
        {
            return Err(Error::Unsupported {
                table: self.name.clone(),
                what: format!(
                    "data file '{}' in format {:?} (only Parquet is read)",
                    t.data_file_path, t.data_file_format
                ),
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

#[async_trait::async_trait]
impl TableProvider for IcebergTableProvider {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        self.full_schema()
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
        self.scan_with(
            state,
            projection,
            filters,
            limit,
            ScanGrant::unrestricted(),
            false,
        )
        .await
    }
}

impl IcebergTableProvider {
    /// Scans under `grant`: as its principal, with keys limited to its scope, through its
    /// provider (else the catalog's). With `set_predicate`, `filters` (which must
    /// only name columns the principal may see in plaintext) are also given to the
    /// Parquet reader, for use when a node above blocks DataFusion's own pushdown.
    ///
    /// Row-level deletes of the snapshot are applied here (see `deletes.rs`).
    pub async fn scan_with(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
        grant: ScanGrant,
        set_predicate: bool,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let projection: Vec<usize> = projection
            .cloned()
            .unwrap_or_else(|| (0..self.full_schema().fields().len()).collect());
        // Iceberg-native encryption: each data and delete file under its own key, from
        // the manifests of the snapshot (read first: a manifest that does not decrypt is
        // named here).
        let file_keys = self.file_keys().await?;
        let mut tasks = self.plan_files(filters).await?;
        if let Some(only) = &self.only_files {
            tasks.retain(|t| only.contains(&t.data_file_path));
        }
        if tasks.is_empty() {
            return Ok(Arc::new(EmptyExec::new(Arc::new(
                self.full_schema().project(&projection)?,
            ))));
        }
        let mut store_url = None;
        for t in &tasks {
            let (url, _, _) = self.object_path(&t.data_file_path)?;
            if store_url.get_or_insert_with(|| url.clone()) != &url {
                return Err(Error::UnsupportedLocation {
                    table: self.name.clone(),
                    location: t.data_file_path.clone(),
                    reason: "data files span several object stores".into(),
                }
                .into());
            }
        }
        let store_url = store_url.expect("non-empty");
        let options = state.config_options();
        let first = &tasks[0].data_file_path;
        let store = self.store_of(first)?;
        // DataFusion looks the scan's store URL up before opening files, although our
        // reader factory reads through `store`. With credentials vended by the catalog
        // (and none configured), only the table's store can be built: register it.
        if state.runtime_env().object_store(&store_url).is_err() {
            state
                .runtime_env()
                .register_object_store(store_url.as_ref(), Arc::clone(&store));
        }
        let (_, first_path, first_name) = self.object_path(first)?;
        let prefix = first_name
            .strip_suffix(&first_path)
            .unwrap_or("/")
            .to_owned();
        // Equality deletes need their columns' keys even where the query does not read
        // them (the values are used inside the scan only, then projected away).
        let delete_keys: BTreeMap<i32, (String, String)> = tasks
            .iter()
            .flat_map(|t| &t.deletes)
            .filter_map(|d| d.equality_ids.as_ref())
            .flatten()
            .filter_map(|id| {
                let name = self.schema.field(column_of(&self.schema, *id)?).name();
                Some((*id, (name.clone(), grant.column_keys.get(name)?.clone())))
            })
            .collect();
        let scan_keys =
            ScanKeys::new(grant, &self.crypto).with_application(self.application_context());
        let factory = |scope: KeyScope| {
            let mut keys = scan_keys.clone();
            keys.grant.scope = scope;
            let factory = DecryptingReaderFactory::new(Arc::clone(&store), keys)
                .with_file_prefix(prefix.clone());
            Arc::new(match &file_keys {
                Some(k) => factory.with_file_keys(Arc::clone(k)),
                None => factory,
            })
        };
        let data_factory = factory(scan_keys.grant.scope.clone());
        let delete_factory = factory(widen(&scan_keys.grant.scope, &delete_keys));
        let predicate = match conjunction(filters.iter().cloned().map(unnormalize_col)) {
            Some(expr) if set_predicate => {
                let df_schema = DFSchema::try_from(self.schema.as_ref().clone())?;
                Some(state.create_physical_expr(expr, &df_schema)?)
            }
            _ => None,
        };
        let path_of = |location: &str| self.object_path(location).map(|(_, p, _)| p);
        let reading = |factory: &Arc<DecryptingReaderFactory>| FileReading {
            table: &self.name,
            state,
            store_url: store_url.clone(),
            factory: Arc::clone(factory),
            path_of: &path_of,
            file_io: self.table.file_io(),
            file_keys: file_keys.as_deref(),
        };
        let deletes = if tasks.iter().any(|t| !t.deletes.is_empty()) {
            Deletes::load(&reading(&delete_factory), &self.schema, &tasks).await?
        } else {
            Deletes::default()
        };
        // Row selections of files with position deletes (their footers fetched a few at
        // a time), then files grouped by the equality delete files that apply to them
        // (most often none).
        let (data_reading, delete_reading) = (reading(&data_factory), reading(&delete_factory));
        let mut pending = Vec::with_capacity(tasks.len());
        for t in &tasks {
            let r = if deletes.equality_files(t).is_empty() {
                &data_reading
            } else {
                &delete_reading
            };
            pending.push(deletes.access_plan(r, t).boxed());
        }
        let plans: Vec<_> = futures::stream::iter(pending)
            .buffered(LOAD_CONCURRENCY)
            .try_collect()
            .await?;
        // The decrypting reader decrypts only the page index of columns this scan may
        // read (others get a stand-in), so the page index is on, as for plaintext files.
        let source = |factory: &Arc<DecryptingReaderFactory>| {
            let table_schema = datafusion::datasource::table_schema::TableSchema::new(
                self.file_schema(),
                if self.file_column {
                    vec![Self::file_field()]
                } else {
                    vec![]
                },
            );
            let source = ParquetSource::new(table_schema)
                .with_parquet_file_reader_factory(Arc::clone(factory) as _)
                .with_table_parquet_options(TableParquetOptions {
                    global: options.execution.parquet.clone(),
                    ..Default::default()
                });
            match &predicate {
                Some(p) => source.with_predicate(Arc::clone(p)),
                None => source,
            }
        };
        if self.lineage {
            return self
                .lineage_scan(
                    tasks.iter().zip(plans).collect(),
                    &deletes,
                    &source(&data_factory),
                    &store_url,
                    &projection,
                    options.execution.target_partitions,
                )
                .await;
        }
        let stats = self
            .file_statistics(&tasks, &data_factory, &scan_keys.grant)
            .await;
        let mut groups: BTreeMap<Vec<String>, Vec<ScanFile>> = BTreeMap::new();
        for ((t, plan), stats) in tasks.iter().zip(plans).zip(stats) {
            let file = self.scan_file(t, plan)?;
            groups
                .entry(deletes.equality_files(t))
                .or_default()
                .push(ScanFile {
                    file,
                    rows: t.record_count,
                    exact: t.deletes.is_empty(),
                    stats,
                });
        }
        let mut plans: Vec<Arc<dyn ExecutionPlan>> = Vec::with_capacity(groups.len());
        for (eq_files, files) in groups {
            if eq_files.is_empty() {
                let limit = if filters.is_empty() { limit } else { None };
                plans.push(self.data_scan(
                    source(&data_factory),
                    &store_url,
                    files,
                    &projection,
                    limit,
                    self.split.unwrap_or(options.execution.target_partitions),
                )?);
                continue;
            }
            // Also read the equality columns, drop deleted rows, then project them away.
            let mut columns = projection.clone();
            for id in deletes.equality_ids(&eq_files) {
                let i = column_of(&self.schema, id).expect("checked when loaded");
                if !columns.contains(&i) {
                    columns.push(i);
                }
            }
            let scan = self.data_scan(
                source(&delete_factory),
                &store_url,
                files,
                &columns,
                None,
                self.split.unwrap_or(options.execution.target_partitions),
            )?;
            let keys = deletes.filter_for(&eq_files, &self.schema, &columns)?;
            plans.push(Arc::new(IcebergDeletesExec::try_new(
                scan,
                keys,
                (0..projection.len()).collect(),
            )?));
        }
        let plan = if plans.len() == 1 {
            plans.pop().expect("one plan")
        } else {
            UnionExec::try_new(plans)?
        };
        Ok(match (&self.as_of, &self.snapshot) {
            (Some(as_of), Some(s)) => Arc::new(IcebergSnapshotExec {
                input: plan,
                table: self.name.clone(),
                snapshot_id: s.snapshot_id(),
                as_of: as_of.clone(),
            }),
            _ => plan,
        })
    }

    /// The file DataFusion reads for `t`: its path in its store, `_file` for a rewrite
    /// scan, the access plan skipping its deleted rows.
    fn scan_file(
        &self,
        t: &FileScanTask,
        plan: Option<datafusion::datasource::physical_plan::parquet::ParquetAccessPlan>,
    ) -> Result<PartitionedFile> {
        let (_, path, _) = self.object_path(&t.data_file_path)?;
        let mut file = PartitionedFile::new(path, t.file_size_in_bytes);
        if self.file_column {
            file.partition_values = vec![datafusion::common::ScalarValue::Utf8(Some(
                t.data_file_path.clone(),
            ))];
        }
        if let Some(plan) = plan {
            file = file.with_extensions(Arc::new(plan));
        }
        Ok(file)
    }

    /// The lineage scan of `tasks` (see `lineage.rs`): one scan per data file, in file
    /// order, whose rows get their `_row_id` and `_last_updated_sequence_number`.
    async fn lineage_scan(
        &self,
        tasks: Vec<(
            &FileScanTask,
            Option<datafusion::datasource::physical_plan::parquet::ParquetAccessPlan>,
        )>,
        deletes: &Deletes,
        source: &ParquetSource,
        store_url: &ObjectStoreUrl,
        projection: &[usize],
        partitions: usize,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let refuse = |what: String| -> DataFusionError {
            Error::Unsupported {
                table: self.name.clone(),
                what,
            }
            .into()
        };
        if tasks
            .iter()
            .any(|(t, _)| !deletes.equality_files(t).is_empty())
        {
            return Err(refuse(
                "rewriting data files that equality deletes apply to in a format 3 table (the rows' lineage cannot be kept)".into(),
            ));
        }
        let snapshot = self.snapshot.as_ref().expect("tasks come from a snapshot");
        let inherited = crate::lineage::of_snapshot(&self.table, snapshot.snapshot_id())
            .await
            .map_err(|source| Error::Iceberg {
                table: self.name.clone(),
                source: Box::new(source),
            })?;
        let mut files = Vec::with_capacity(tasks.len());
        for (t, plan) in tasks {
            let (Some(rows), Some(inherited)) =
                (t.record_count, inherited.get(&t.data_file_path).copied())
            else {
                return Err(refuse(format!(
                    "rewriting data file '{}' without its manifest entry's row count",
                    t.data_file_path
                )));
            };
            let file = self.scan_file(t, plan)?;
            let scan = self.data_scan_unsplit(
                source.clone(),
                store_url,
                ScanFile {
                    file,
                    rows: Some(rows),
                    exact: t.deletes.is_empty(),
                    stats: None,
                },
                projection,
            )?;
            files.push(crate::lineage::LineageFile {
                scan,
                location: t.data_file_path.clone(),
                inherited,
                deleted: deletes
                    .deleted_positions(&t.data_file_path)
                    .map(|d| Arc::new(d.clone())),
                rows,
            });
        }
        let schema = Arc::new(self.full_schema().project(projection)?);
        Ok(Arc::new(crate::lineage::LineageExec::new(
            self.name.clone(),
            files,
            schema,
            partitions,
        )))
    }
}
