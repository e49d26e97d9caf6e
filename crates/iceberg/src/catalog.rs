//! Iceberg catalogs as DataFusion catalogs: `catalog.namespace.table`.

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use clearice_crypto::ProviderRef;
use datafusion::catalog::{CatalogProvider, SchemaProvider, TableProvider};
use datafusion::error::Result as DfResult;
use iceberg::{Catalog, CatalogBuilder, NamespaceIdent, TableIdent};
use iceberg_catalog_hms::{HMS_CATALOG_PROP_URI, HMS_CATALOG_PROP_WAREHOUSE, HmsCatalogBuilder};
use iceberg_catalog_rest::{
    REST_CATALOG_PROP_URI, REST_CATALOG_PROP_WAREHOUSE, RestCatalogBuilder,
};
use iceberg_catalog_sql::SqlCatalogBuilder;

use crate::commit::Committer;
use crate::error::{Error, Result};
use crate::metadata::metadata_table;
use crate::provider::{AsOf, IcebergTableProvider};
use crate::restrictions::RestRestrictions;
use crate::travel::split_name;
use clearice_storage::{LakeStorageFactory, LakeStores};

/// Opens an Iceberg SQL catalog (SQLite or PostgreSQL, the schema of the Iceberg JDBC
/// catalog and PyIceberg's `SqlCatalog`) whose files are on `stores` (local or S3).
pub async fn open_sql_catalog(
    name: &str,
    uri: &str,
    warehouse: &str,
    stores: &LakeStores,
) -> Result<Arc<dyn Catalog>> {
    open_sql_catalog_with(name, uri, warehouse, HashMap::new(), stores).await
}

/// [`open_sql_catalog`] with catalog properties (`s3.*` reach the catalog's file IO).
pub async fn open_sql_catalog_with(
    name: &str,
    uri: &str,
    warehouse: &str,
    props: HashMap<String, String>,
    stores: &LakeStores,
) -> Result<Arc<dyn Catalog>> {
    sqlx::any::install_default_drivers();
    let builder = SqlCatalogBuilder::default()
        .uri(uri)
        .warehouse_location(warehouse);
    load(builder, name, uri, props, stores).await
}

/// Loads a catalog whose file IO is `stores`; a failure names the catalog and its URI
/// (without a password).
async fn load<B>(
    builder: B,
    name: &str,
    uri: &str,
    props: HashMap<String, String>,
    stores: &LakeStores,
) -> Result<Arc<dyn Catalog>>
where
    B: CatalogBuilder,
    B::C: 'static,
{
    let catalog = builder
        .with_storage_factory(Arc::new(LakeStorageFactory::new(stores.clone())))
        .load(name, props)
        .await
        .map_err(|source| Error::CatalogOpen {
            catalog: name.into(),
            uri: redact_uri(uri),
            source: Box::new(source),
        })?;
    Ok(Arc::new(catalog))
}

/// Opens an Iceberg REST catalog at `uri`. `props` are the REST client's properties
/// (`credential` = `client_id:secret` for OAuth2 client credentials, `token`,
/// `oauth2-server-uri`, `scope`, `header.NAME`, and `s3.*` storage properties); the
/// catalog's own config and each table's config (vended credentials) are merged in by
/// the client. The connection is made on first use (the listing).
pub async fn open_rest_catalog(
    name: &str,
    uri: &str,
    warehouse: Option<&str>,
    mut props: HashMap<String, String>,
    stores: &LakeStores,
) -> Result<Arc<dyn Catalog>> {
    props.insert(
        REST_CATALOG_PROP_URI.into(),
        uri.trim_end_matches('/').into(),
    );
    if let Some(w) = warehouse {
        props.insert(REST_CATALOG_PROP_WAREHOUSE.into(), w.into());
    }
    load(RestCatalogBuilder::default(), name, uri, props, stores).await
}

/// Opens a Hive Metastore catalog at `uri` (`thrift://host:9083`, or `host:9083`).
/// Iceberg tables registered there (by Spark, Hive, PyIceberg...) load like any other;
/// iceberg-catalog-hms 0.10.1 cannot commit to them (no appends through it).
pub async fn open_hms_catalog(
    name: &str,
    uri: &str,
    warehouse: Option<&str>,
    mut props: HashMap<String, String>,
    stores: &LakeStores,
) -> Result<Arc<dyn Catalog>> {
    let address = uri.strip_prefix("thrift://").unwrap_or(uri);
    props.insert(
        HMS_CATALOG_PROP_URI.into(),
        address.trim_end_matches('/').into(),
    );
    // The warehouse is only used for tables created through this catalog.
    props.insert(
        HMS_CATALOG_PROP_WAREHOUSE.into(),
        warehouse.unwrap_or("file:///nonexistent").into(),
    );
    load(HmsCatalogBuilder::default(), name, uri, props, stores).await
}

/// The URI without a password (`postgres://user:secret@host` → `postgres://user:***@host`).
pub fn redact_uri(uri: &str) -> String {
    match url::Url::parse(uri) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => uri.to_owned(),
    }
}

type Schemas = BTreeMap<String, Arc<IcebergSchemaProvider>>;

/// A DataFusion catalog over an Iceberg catalog. DataFusion's listing API is synchronous,
/// so namespaces and table names are listed when the catalog is opened and again by
/// [`IcebergCatalogProvider::refresh_if_older`] (sessions call it before each statement,
/// so tables created or dropped by other writers show up without a restart); each query
/// asks the catalog for its tables' current metadata (an unchanged table reuses the
/// manifests read before: `loaded.rs`).
pub struct IcebergCatalogProvider {
    name: String,
    catalog: Arc<dyn Catalog>,
    crypto: ProviderRef,
    stores: LakeStores,
    schemas: std::sync::RwLock<Arc<Schemas>>,
    /// Takes commits that remove files.
    committer: Committer,
    /// When the listing was last refreshed (held while refreshing: one refresh at a time;
    /// others do not wait for it).
    listed_at: tokio::sync::Mutex<std::time::Instant>,
    /// A REST catalog's read restrictions, asked per table and principal.
    restrictions: Option<Arc<RestRestrictions>>,
}

impl std::fmt::Debug for IcebergCatalogProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IcebergCatalogProvider")
            .field("name", &self.name)
            .field("schemas", &self.schemas())
            .finish_non_exhaustive()
    }
}

impl IcebergCatalogProvider {
    /// Opens the catalog's listing; data files are read from `stores`; `restrictions`:
    /// a REST catalog's read restrictions, which its tables carry to the access layer.
    pub async fn try_new(
        name: &str,
        catalog: Arc<dyn Catalog>,
        crypto: ProviderRef,
        stores: LakeStores,
        committer: Committer,
        restrictions: Option<Arc<RestRestrictions>>,
    ) -> Result<Self> {
        let schemas = list(name, &catalog, &crypto, &stores, &committer, &restrictions).await?;
        Ok(Self {
            name: name.to_owned(),
            catalog,
            crypto,
            stores,
            committer,
            schemas: std::sync::RwLock::new(Arc::new(schemas)),
            listed_at: tokio::sync::Mutex::new(std::time::Instant::now()),
            restrictions,
        })
    }

    /// The catalog's name in SQL.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The Iceberg catalog.
    pub fn iceberg(&self) -> &Arc<dyn Catalog> {
        &self.catalog
    }

    /// How the catalog takes commits iceberg-rust cannot make.
    pub fn committer(&self) -> &Committer {
        &self.committer
    }

    /// Lists namespaces and tables again now (after this session changed them), waiting
    /// for a refresh under way.
    pub async fn refresh_now(&self) {
        let mut listed_at = self.listed_at.lock().await;
        self.relist().await;
        *listed_at = std::time::Instant::now();
    }

    /// Lists again; a catalog that cannot be listed keeps its listing (logged).
    async fn relist(&self) {
        match list(
            &self.name,
            &self.catalog,
            &self.crypto,
            &self.stores,
            &self.committer,
            &self.restrictions,
        )
        .await
        {
            Ok(schemas) => *self.schemas.write().expect("schemas") = Arc::new(schemas),
            Err(e) => {
                tracing::warn!(catalog = %self.name, error = %e, "catalog listing not refreshed")
            }
        }
    }

    /// The namespace `name` as listed last.
    pub fn schema_provider(&self, name: &str) -> Option<Arc<IcebergSchemaProvider>> {
        self.schemas().get(name).map(Arc::clone)
    }

    fn schemas(&self) -> Arc<Schemas> {
        Arc::clone(&self.schemas.read().expect("schemas"))
    }

    /// Lists namespaces and tables again if the listing is older than `max_age`. A
    /// catalog that cannot be listed keeps its previous listing (logged). Called before
    /// every statement: while another caller refreshes, this one goes on with the current
    /// listing instead of waiting.
    pub async fn refresh_if_older(&self, max_age: std::time::Duration) {
        let Ok(mut listed_at) = self.listed_at.try_lock() else {
            return;
        };
        if listed_at.elapsed() < max_age {
            return;
        }
        self.relist().await;
        *listed_at = std::time::Instant::now();
    }
}

/// Lists namespaces (nested ones joined with `.`) and their tables.
/// `r`, or nothing when its namespace does not exist.
fn or_empty<T>(r: iceberg::Result<Vec<T>>) -> iceberg::Result<Vec<T>> {
    match r {
        Err(e) if e.kind() == iceberg::ErrorKind::NamespaceNotFound => Ok(vec![]),
        other => other,
    }
}

async fn list(
    name: &str,
    catalog: &Arc<dyn Catalog>,
    crypto: &ProviderRef,
    stores: &LakeStores,
    committer: &Committer,
    restrictions: &Option<Arc<RestRestrictions>>,
) -> Result<Schemas> {
    let err = |source: iceberg::Error| Error::Iceberg {
        table: name.to_owned(),
        source: Box::new(source),
    };
    let mut pending = catalog.list_namespaces(None).await.map_err(err)?;
    let mut schemas = BTreeMap::new();
    // A nested namespace's parent may exist only as a prefix (PyIceberg creates
    // `a.b` without `a`): listed, it has no children or tables of its own.
    while let Some(ns) = pending.pop() {
        pending.extend(or_empty(catalog.list_namespaces(Some(&ns)).await).map_err(err)?);
        let tables = or_empty(catalog.list_tables(&ns).await).map_err(err)?;
        let schema_name = ns.clone().inner().join(".");
        schemas.insert(
            schema_name.clone(),
            Arc::new(IcebergSchemaProvider {
                catalog_name: name.to_owned(),
                schema_name,
                namespace: ns,
                tables: tables.into_iter().map(|t| t.name).collect(),
                catalog: Arc::clone(catalog),
                crypto: Arc::clone(crypto),
                stores: stores.clone(),
                committer: committer.clone(),
                restrictions: restrictions.clone(),
            }),
        );
    }
    Ok(schemas)
}

impl CatalogProvider for IcebergCatalogProvider {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema_names(&self) -> Vec<String> {
        self.schemas().keys().cloned().collect()
    }

    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        self.schemas().get(name).map(|s| Arc::clone(s) as _)
    }
}

/// One Iceberg namespace.
pub struct IcebergSchemaProvider {
    catalog_name: String,
    schema_name: String,
    namespace: NamespaceIdent,
    tables: Vec<String>,
    catalog: Arc<dyn Catalog>,
    crypto: ProviderRef,
    stores: LakeStores,
    committer: Committer,
    restrictions: Option<Arc<RestRestrictions>>,
}

impl std::fmt::Debug for IcebergSchemaProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IcebergSchemaProvider")
            .field("catalog", &self.catalog_name)
            .field("namespace", &self.schema_name)
            .field("tables", &self.tables)
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl SchemaProvider for IcebergSchemaProvider {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn table_names(&self) -> Vec<String> {
        self.tables.clone()
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        if let Some(kind) = split_name(name).1 {
            let Some(t) = self.load(name, None).await? else {
                return Ok(None);
            };
            return Ok(Some(metadata_table(&t, kind, &|_| true).await?));
        }
        match self.load(name, None).await {
            // Dropped by another writer since the listing: a lookup (information_schema,
            // a statement's tables) finds no table. Callers deciding on the table itself
            // (DDL's restriction checks) use `load`, which keeps the error.
            Err(e) if dropped_since_listing(&e) => Ok(None),
            Err(e) => unreadable(e),
            Ok(t) => Ok(t.map(|t| Arc::new(t) as _)),
        }
    }

    fn table_exist(&self, name: &str) -> bool {
        let base = split_name(name).0;
        self.tables.iter().any(|t| t == base)
    }
}

impl IcebergSchemaProvider {
    /// `catalog.namespace.table`.
    pub fn full_name(&self, table: &str) -> String {
        format!("{}.{}.{table}", self.catalog_name, self.schema_name)
    }

    /// Loads a table's current metadata from the catalog (`t$files`: the table `t`), as of a
    /// snapshot if `as_of` says so.
    pub async fn load(
        &self,
        name: &str,
        as_of: Option<&AsOf>,
    ) -> DfResult<Option<IcebergTableProvider>> {
        let name = split_name(name).0;
        if !self.tables.iter().any(|t| t == name) {
            return Ok(None);
        }
        let ident = TableIdent::new(self.namespace.clone(), name.to_owned());
        let full = self.full_name(name);
        let table = self.catalog.load_table(&ident).await.map_err(|source| {
            // iceberg 0.10.1's catalogs build tables without a KMS client, so a table
            // with Iceberg-native encryption fails to load with this precondition.
            if crate::native::is_untrusted(&source) {
                return Error::Untrusted {
                    table: full.clone(),
                    reason: source.message().to_owned(),
                };
            }
            if source.kind() == iceberg::ErrorKind::PreconditionFailed
                && source.message().contains("encryption.key-id")
            {
                return Error::Unsupported {
                    table: full.clone(),
                    what: "Iceberg-native table encryption (format v3 'encryption.key-id'; \
                               ClearIce reads Parquet Modular Encryption key material only)"
                        .into(),
                };
            }
            Error::Iceberg {
                table: full.clone(),
                source: Box::new(source),
            }
        })?;
        let provider = IcebergTableProvider::try_new(
            full,
            crate::loaded::reuse(table),
            Arc::clone(&self.crypto),
            self.stores.clone(),
        )?
        .with_catalog(Arc::clone(&self.catalog), self.committer.clone())
        .with_restrictions(self.restrictions.clone(), &ident);
        Ok(Some(match as_of {
            Some(as_of) => provider.as_of(as_of.clone())?,
            None => provider,
        }))
    }
}

/// Whether loading a listed table failed because the catalog no longer has it.
fn dropped_since_listing(e: &datafusion::error::DataFusionError) -> bool {
    matches!(
        e,
        datafusion::error::DataFusionError::External(inner)
            if matches!(
                inner.downcast_ref::<Error>(),
                Some(Error::Iceberg { source, .. }) if source.kind() == iceberg::ErrorKind::TableNotFound
            )
    )
}

/// A table ClearIce cannot read at all (`Error::Unsupported` when loading it, or
/// `Error::Untrusted`: metadata its catalog does not vouch for) stands in as
/// [`UnreadableTable`], so listings (`information_schema`, Flight `GetTables`, DBeaver's
/// browser) still work; other load errors fail the statement.
pub fn unreadable(
    e: datafusion::error::DataFusionError,
) -> DfResult<Option<Arc<dyn TableProvider>>> {
    if let datafusion::error::DataFusionError::External(inner) = &e {
        let why = match inner.downcast_ref::<Error>() {
            Some(Error::Unsupported { table, what }) => {
                Some((table, Unreadable::Unsupported(what.clone())))
            }
            Some(Error::Untrusted { table, reason }) => {
                Some((table, Unreadable::Untrusted(reason.clone())))
            }
            _ => None,
        };
        if let Some((table, why)) = why {
            return Ok(Some(Arc::new(UnreadableTable {
                table: table.clone(),
                why,
            })));
        }
    }
    Err(e)
}

/// Why a table is [`UnreadableTable`].
#[derive(Debug, Clone)]
enum Unreadable {
    Unsupported(String),
    Untrusted(String),
}

/// A table that lists (no columns) and fails with its reason when scanned.
#[derive(Debug)]
pub struct UnreadableTable {
    table: String,
    why: Unreadable,
}

#[async_trait::async_trait]
impl TableProvider for UnreadableTable {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> datafusion::arrow::datatypes::SchemaRef {
        Arc::new(datafusion::arrow::datatypes::Schema::empty())
    }

    fn table_type(&self) -> datafusion::datasource::TableType {
        datafusion::datasource::TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn datafusion::catalog::Session,
        _projection: Option<&Vec<usize>>,
        _filters: &[datafusion::logical_expr::Expr],
        _limit: Option<usize>,
    ) -> DfResult<Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
        let table = self.table.clone();
        Err(match self.why.clone() {
            Unreadable::Unsupported(what) => Error::Unsupported { table, what },
            Unreadable::Untrusted(reason) => Error::Untrusted { table, reason },
        }
        .into())
    }
}
