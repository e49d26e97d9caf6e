//! Session building for ClearIce: reads `clearice.toml`, opens the Iceberg catalogs,
//! sets up key resolution, and builds DataFusion sessions in which encrypted Iceberg
//! tables and standalone PME Parquet files decrypt transparently.
//!
//! ```text
//!  Config::load ─▶ Engine::open: catalogs (SQL, REST, Hive), KeyResolver and crypto
//!                  providers, policy, audit log, [cluster] signer
//!  Engine::session_as(Caller) ─▶ Session::sql / sql_stream / execute
//!    parse ─▶ route (every DataFusion statement kind, no wildcard) ─▶ clearice-access
//!    checks (named columns, write rules, confinement) ─▶ execute on the CpuExecutor
//!    ─▶ AuditedStream ─▶ one audit record per table access, with the outcome
//!  Engine::distribute ─▶ clearice-cluster's coordinator; Engine::serve_worker ─▶ worker
//! ```
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! let config = clearice_engine::Config::load("clearice.toml".as_ref())?;
//! let engine = clearice_engine::Engine::open(config).await?;
//! let session = engine.session("admin");
//! let out = session.sql("SELECT count(*) FROM lake.sales.customers").await?;
//! println!("{} rows", out.rows());
//! # Ok(()) }
//! ```
// Dependencies nothing uses fail the build (tests add dev-dependencies, so not there).
#![cfg_attr(not(test), deny(unused_crate_dependencies))]
#![deny(missing_docs)]

mod audit;
mod check;
mod columns;
mod config;
mod dynamic_rows;
mod error;
mod executor;
mod guard;
mod local;
mod memory;
mod options;
mod rotate;
mod route;
mod session;

pub use dynamic_rows::{DynamicFilterExec, RowLevelDynamicFilters};
use local::LocalParts;
pub use options::ClearIceOptions;

use std::collections::HashMap;
use std::sync::Arc;

use clearice_access::{SessionAccess, SessionCatalogProvider};
use clearice_crypto::{KeyResolver, ScanGrant};
use clearice_crypto::{KeyScope, LocalProvider, ProviderRef, Providers, RemoteProvider};
use clearice_iceberg::{
    IcebergCatalogProvider, native, open_hms_catalog, open_rest_catalog, open_sql_catalog_with,
};
use clearice_pme::{DecryptingParquetFormatFactory, DecryptingReaderFactory, ScanKeys};
use clearice_policy::Policy;
use clearice_storage::{LakeRegistry, LakeStores};
use datafusion::execution::cache::cache_manager::{CacheManager, CacheManagerConfig};
use datafusion::execution::object_store::ObjectStoreRegistry;
use datafusion::execution::parquet_encryption::EncryptionFactoryRegistry;
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};

pub use audit::{AuditError, AuditLog};
pub use clearice_access::confine::{
    CATALOG_STORE_URL, Confinement, Refusal, SETTABLE_OPTIONS, refusal_of,
};
pub use clearice_access::limits::{LimitExceeded, limit_of};
pub use clearice_access::{Caller, FrontEnd, cause_of, one_line};
pub use clearice_cluster::{
    ClearIceCodec, ClusterError, END_QUERY, MIN_SECRET_BYTES, QUERY_HEADER, TaskSigner,
    encoding_for,
};
pub use clearice_crypto::AccessToken;
pub use clearice_iceberg::Error as TableError;
pub use clearice_iceberg::sql::parse_statements;
pub use clearice_storage::{Requests as StorageRequests, S3Options, Secret};
pub use config::{
    AuditConfig, CatalogConfig, CatalogKind, ClusterConfig, Config, ExecutionConfig,
    ExplicitKeysConfig, KmsConfig, KmsKind, LimitsConfig, MemoryPoolKind, PolicyConfig,
    ProviderConfig, ProviderKind, ServerConfig, ServerUser, ShellConfig,
};
pub use error::{Error, ErrorClass, Result, classify, message_of};
pub use executor::CpuExecutor;
pub use rotate::{RotationReport, rotate_master_key};
pub use session::{CATALOG_LISTING_MAX_AGE, QueryOutput, SCRATCH_CATALOG, Session};

/// A hash join whose build side is estimated at most this many bytes (and
/// [`HASH_JOIN_COLLECT_ROWS`] rows) builds one table that every partition probes
/// (`CollectLeft`) instead of repartitioning both sides by the join key. DataFusion's
/// defaults are 1 MiB and 128 Ki rows; measured with `benches/tpch/run.py --variant`
/// (SF1, 2 cores), 64 MiB / 4 Mi rows cut the 22 queries by 7-9 % (q7 -28 %, q18 -24 %,
/// q5 -12 %), while 16 MiB bought 3 % and 256 MiB no more than 64 MiB. Set per session
/// with `datafusion.optimizer.hash_join_single_partition_threshold(_rows)`.
pub const HASH_JOIN_COLLECT_BYTES: usize = 64 << 20;
/// See [`HASH_JOIN_COLLECT_BYTES`].
pub const HASH_JOIN_COLLECT_ROWS: usize = 4 << 20;

/// Process-wide state shared by all sessions: catalogs, keys, runtime.
#[derive(Debug)]
pub struct Engine {
    config: Config,
    catalogs: Vec<(String, Arc<IcebergCatalogProvider>)>,
    iceberg: HashMap<String, Arc<dyn iceberg::Catalog>>,
    /// Local disk and S3 (every catalog's files, side files, S3 request counts).
    stores: LakeStores,
    resolver: Arc<KeyResolver>,
    /// Does the module cryptography of every scan (`local`: keys from the KMS).
    crypto: ProviderRef,
    /// `local` and the configured providers (tables route keys to them by policy).
    providers: Arc<Providers>,
    policy: Arc<Policy>,
    audit: Option<Arc<AuditLog>>,
    runtime: Arc<RuntimeEnv>,
    /// The policy's file areas with their canonical roots.
    area_roots: Vec<(
        clearice_policy::Area,
        std::path::PathBuf,
        std::path::PathBuf,
    )>,
    permits: Arc<clearice_access::limits::Permits>,
    /// Signs and verifies scans sent to workers (`[cluster]` configured).
    signer: Option<Arc<TaskSigner>>,
    /// `[cluster] tls_*`: mutual TLS on every channel between coordinator and workers.
    cluster_tls: Option<Arc<clearice_cluster::ClusterTls>>,
    /// Sends scans to workers (after [`Engine::distribute`]).
    coordinator: Option<clearice_cluster::Coordinator>,
    /// The `hmac_sha256` mask's secret (the policy's `[masks] hmac_key_file`).
    mask_key: Option<Arc<clearice_crypto::MaskKey>>,
}

impl Engine {
    /// Opens every configured catalog and the KMS. Files (keyring, explicit keys, policy,
    /// audit log, file areas) are read on a blocking thread.
    pub async fn open(config: Config) -> Result<Self> {
        let cfg = config.clone();
        let LocalParts {
            resolver,
            remote,
            policy,
            audit,
            area_roots,
            s3,
            catalog_props,
            mut principal_tokens,
            signer,
            cluster_tls,
            mask_key,
        } = tokio::task::spawn_blocking(move || LocalParts::load(&cfg))
            .await
            .map_err(|e| Error::ConfigRead {
                path: config.source.clone(),
                reason: format!("loading failed: {e}"),
            })??;
        let stores = LakeStores::new(s3);
        // Iceberg data files are read through their own store names (CATALOG_STORE_URL,
        // `clearice-s3://BUCKET`); the machine's own sessions also reach `s3://`.
        let runtime = RuntimeEnvBuilder::new()
            .with_object_store_registry(Arc::new(LakeRegistry::new(stores.clone(), true)))
            .with_memory_pool(memory::pool(&config.execution))
            .build_arc()
            .map_err(|e| Error::ConfigRead {
                path: config.source.clone(),
                reason: format!("runtime: {e}"),
            })?;
        runtime.register_object_store(
            &url::Url::parse(CATALOG_STORE_URL).expect("static URL"),
            stores.local(),
        );
        // One provider for every scan of every session (catalog tables and files).
        let crypto: ProviderRef = Arc::new(LocalProvider::new(
            Arc::clone(&resolver),
            Some(stores.side_file_reader()),
        ));
        let mut named = Vec::new();
        for (name, r) in remote {
            let p = RemoteProvider::new(r, Some(stores.side_file_reader()))?;
            named.push((name, Arc::new(p) as ProviderRef));
        }
        let providers = Arc::new(Providers::new(Arc::clone(&crypto), named));
        let mut catalogs = Vec::new();
        let mut iceberg = HashMap::new();
        for (name, cat) in &config.catalogs {
            let ice = match cat.kind {
                CatalogKind::Sql => {
                    open_sql_catalog_with(
                        name,
                        &resolve_sqlite_uri(&config, &cat.uri),
                        cat.warehouse.as_deref().expect("validated at load"),
                        catalog_props.get(name).cloned().unwrap_or_default(),
                        &stores,
                    )
                    .await?
                }
                CatalogKind::Rest => {
                    open_rest_catalog(
                        name,
                        &cat.uri,
                        cat.warehouse.as_deref(),
                        catalog_props.get(name).cloned().unwrap_or_default(),
                        &stores,
                    )
                    .await?
                }
                CatalogKind::Hms => {
                    open_hms_catalog(
                        name,
                        &cat.uri,
                        cat.warehouse.as_deref(),
                        catalog_props.get(name).cloned().unwrap_or_default(),
                        &stores,
                    )
                    .await?
                }
            };
            // Tables Iceberg encrypts itself load with the engine's KMS (iceberg-rust's
            // catalogs cannot build them): located in the catalog by ClearIce.
            let locator = match cat.kind {
                CatalogKind::Sql => {
                    native::Locator::sql(name, &resolve_sqlite_uri(&config, &cat.uri))
                }
                CatalogKind::Hms => native::Locator::hms(&cat.uri).await.map_err(|source| {
                    clearice_iceberg::Error::CatalogOpen {
                        catalog: name.clone(),
                        uri: clearice_iceberg::redact_uri(&cat.uri),
                        source: Box::new(source),
                    }
                })?,
                CatalogKind::Rest => native::Locator::Unsupported {
                    reason: "REST catalogs are not asked for such tables yet".into(),
                },
            };
            let props = catalog_props.get(name).cloned().unwrap_or_default();
            let kms_ttl = config
                .kms
                .as_ref()
                .map_or(clearice_crypto::DEFAULT_KEY_CACHE_TTL, |k| k.cache_ttl());
            let ice = native::NativeCatalog::wrap(
                ice,
                locator,
                resolver.kms().cloned().map(|k| (k, kms_ttl)),
                native::file_io(&stores, &props),
            );
            // The first listing is where a REST catalog is first reached: a failure there
            // names the catalog and its URI.
            // Commits that remove files (INSERT OVERWRITE, DELETE, UPDATE) are swapped in
            // by ClearIce itself: SQL catalogs only, for now.
            let committer = match cat.kind {
                CatalogKind::Sql => clearice_iceberg::commit::Committer::sql(
                    name,
                    &resolve_sqlite_uri(&config, &cat.uri),
                ),
                CatalogKind::Rest => clearice_iceberg::commit::Committer::Unsupported {
                    reason: "ClearIce commits only appends to REST catalogs so far".into(),
                },
                CatalogKind::Hms => clearice_iceberg::commit::Committer::Unsupported {
                    reason: "iceberg-catalog-hms 0.10.1 cannot commit to Hive Metastore tables"
                        .into(),
                },
            };
            // A REST catalog's read restrictions are asked by ClearIce itself (iceberg-rust
            // drops them), per table and principal.
            let restrictions = match cat.kind {
                CatalogKind::Rest => Some(Arc::new(rest_restrictions(
                    name,
                    cat,
                    &props,
                    principal_tokens.remove(name),
                )?)),
                CatalogKind::Sql | CatalogKind::Hms => None,
            };
            let provider = IcebergCatalogProvider::try_new(
                name,
                Arc::clone(&ice),
                Arc::clone(&crypto),
                stores.clone(),
                committer,
                restrictions,
            )
            .await
            .map_err(|e| match e {
                clearice_iceberg::Error::Iceberg { source, .. } => {
                    clearice_iceberg::Error::CatalogOpen {
                        catalog: name.clone(),
                        uri: clearice_iceberg::redact_uri(&cat.uri),
                        source,
                    }
                }
                other => other,
            })?;
            catalogs.push((name.clone(), Arc::new(provider)));
            iceberg.insert(name.clone(), ice);
        }
        Ok(Self {
            config,
            catalogs,
            iceberg,
            stores,
            resolver,
            crypto,
            providers,
            audit,
            runtime,
            area_roots,
            policy: Arc::new(policy),
            permits: Arc::default(),
            signer: signer.map(Arc::new),
            cluster_tls: cluster_tls.map(Arc::new),
            mask_key,
            coordinator: None,
        })
    }

    /// Makes this engine a coordinator: catalog scans of every new session run on the
    /// `[cluster]` workers (policy, masks' decisions and audit stay here). Starts probing
    /// the workers (needs a Tokio runtime).
    pub fn distribute(mut self) -> Result<Self> {
        let cluster_err = |reason: String| Error::ConfigValue {
            path: self.config.source.clone(),
            key: "cluster".into(),
            reason,
        };
        let (Some(cluster), Some(signer)) = (&self.config.cluster, &self.signer) else {
            return Err(cluster_err(
                "a coordinator needs [cluster] with workers and secret_file".into(),
            ));
        };
        if cluster.workers.is_empty() {
            return Err(cluster_err("[cluster] workers is empty".into()));
        }
        let workers = clearice_cluster::Workers::start(
            &cluster.workers,
            Arc::clone(signer),
            self.cluster_tls.clone(),
            // Checked at open: at least 1 ms.
            std::time::Duration::from_millis(
                cluster
                    .probe_interval_ms
                    .unwrap_or(clearice_cluster::PROBE_EVERY_MS),
            ),
        )
        .map_err(cluster_err)?;
        let window_mb = cluster
            .retry_window_mb
            .unwrap_or(clearice_cluster::RETRY_WINDOW_MB);
        self.coordinator = Some(clearice_cluster::Coordinator {
            workers,
            signer: Arc::clone(signer),
            partitions_per_worker: cluster.partitions_per_worker,
            retry_window_bytes: usize::try_from(window_mb.saturating_mul(1 << 20))
                .unwrap_or(usize::MAX),
        });
        Ok(self)
    }

    /// The worker service of `clearice worker`: runs the stages coordinators of the same
    /// cluster (same secret) send, planning scans with this engine's catalogs and keys.
    pub fn worker_service(&self) -> Result<datafusion_distributed::Worker> {
        Ok(clearice_cluster::worker(self.worker_sessions()?))
    }

    /// How this engine's worker builds each query's session (its stores, memory, codec).
    fn worker_sessions(&self) -> Result<clearice_cluster::WorkerSessions> {
        let Some(signer) = &self.signer else {
            return Err(Error::ConfigValue {
                path: self.config.source.clone(),
                key: "cluster".into(),
                reason: "a worker needs [cluster] secret_file".into(),
            });
        };
        let cluster = self.config.cluster.as_ref();
        let memory_cap = cluster
            .and_then(|c| c.query_memory_mb)
            .filter(|&mb| mb > 0)
            .map(|mb| usize::try_from(mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX));
        let timeout_cap = std::time::Duration::from_secs(
            cluster
                .and_then(|c| c.query_timeout_s)
                .unwrap_or(clearice_cluster::QUERY_TIMEOUT_S),
        );
        Ok(clearice_cluster::WorkerSessions {
            runtime: Arc::clone(&self.runtime),
            codec: Arc::new(self.worker_codec(Arc::clone(signer))),
            tls: self.cluster_tls.clone(),
            classify: Arc::new(|e| (classify(e), message_of(e))),
            budgets: Arc::new(clearice_cluster::QueryBudgets::new(memory_cap, timeout_cap)),
        })
    }

    /// Serves [`Engine::worker_service`] on `listener` until `shutdown` completes; a call
    /// without a credential of the cluster secret is refused before its message is read.
    pub async fn serve_worker(
        &self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<()> {
        clearice_cluster::serve(self.worker_sessions()?, listener, shutdown)
            .await
            .map_err(|e| Error::Worker(e.to_string()))
    }

    /// The codec this engine's worker decodes plans with (scans verified with `signer`,
    /// planned with this engine's catalogs and keys).
    pub fn worker_codec(&self, signer: Arc<TaskSigner>) -> ClearIceCodec {
        let builder = Arc::new(clearice_cluster::WorkerScans {
            catalogs: self.catalogs.clone(),
            providers: Arc::clone(&self.providers),
            mask_key: self.mask_key.clone(),
        });
        ClearIceCodec::worker(signer, builder)
    }

    /// The workers answering now (a coordinator), else `None`.
    pub fn live_workers(&self) -> Option<Vec<String>> {
        self.coordinator
            .as_ref()
            .map(|c| c.workers.live().iter().map(|u| u.to_string()).collect())
    }

    /// Writes an audit record that is not about a query (a failed or throttled login).
    pub async fn audit_event(
        &self,
        action: &str,
        user: &str,
        client: &str,
        resource: &str,
        error: &str,
    ) -> std::result::Result<(), AuditError> {
        let Some(log) = &self.audit else {
            return Ok(());
        };
        log.write(&clearice_policy::AuditRecord {
            row_filter: None,
            time: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            user: user.to_owned(),
            client: client.to_owned(),
            action: action.to_owned(),
            query_id: String::new(),
            sql_sha256: String::new(),
            table: resource.to_owned(),
            snapshot_id: None,
            columns: vec![],
            allowed: false,
            rows: None,
            error: Some(error.to_owned()),
            retries: vec![],
        })
        .await
    }

    /// The config this engine was opened with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The Iceberg catalog named `name`.
    pub fn iceberg_catalog(&self, name: &str) -> Option<&Arc<dyn iceberg::Catalog>> {
        self.iceberg.get(name)
    }

    /// Master key id of each column of a data file (`None`: plaintext or footer key),
    /// read through the decrypting reader: only the footer key is requested.
    pub async fn file_column_keys(
        &self,
        location: &str,
    ) -> Result<Vec<(String, Option<String>)>, String> {
        use object_store::ObjectStoreExt;
        let (store, path) = self
            .stores
            .resolve_with(location, self.stores.options())
            .map_err(|e| e.to_string())?;
        let size = store.head(&path).await.map_err(|e| e.to_string())?.size;
        let prefix = match clearice_storage::Location::parse(location) {
            Ok(clearice_storage::Location::S3 { bucket, .. }) => format!("s3://{bucket}/"),
            _ => "/".to_owned(),
        };
        let grant = ScanGrant {
            principal: "clearice check".into(),
            scope: KeyScope::MasterKeys(Default::default()),
            ..ScanGrant::unrestricted()
        };
        let keys = ScanKeys::new(grant, &self.crypto);
        DecryptingReaderFactory::new(store, keys)
            .with_file_prefix(prefix)
            .column_keys(datafusion::datasource::listing::PartitionedFile::new(
                path.to_string(),
                size,
            ))
            .await
            .map_err(|e| message_of(&e))
    }

    /// HTTP requests sent to S3 so far (all catalogs, scans and side files).
    pub fn storage_requests(&self) -> StorageRequests {
        self.stores.requests()
    }

    /// The key resolver (metrics: KMS calls).
    pub fn key_resolver(&self) -> &Arc<KeyResolver> {
        &self.resolver
    }

    /// The column policy.
    pub fn policy(&self) -> &Arc<Policy> {
        &self.policy
    }

    /// Gives freed heap memory back to the operating system. glibc keeps freed memory
    /// for reuse, so without this a server's resident memory stays at the peak of its
    /// busiest moment. Blocking (it walks the allocator's free lists): call it on a
    /// blocking thread, when no query runs.
    pub fn release_free_memory() {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim only walks and trims glibc's own free lists; it takes no
        // pointers and is thread-safe.
        #[expect(unsafe_code, reason = "glibc's malloc_trim has no safe binding")]
        unsafe {
            libc::malloc_trim(0);
        }
    }

    /// Bytes reserved in the shared memory pool by running queries (0 when idle).
    pub fn memory_reserved(&self) -> usize {
        self.runtime.memory_pool.reserved()
    }

    /// Has the process's metrics report this engine's memory pool
    /// (`clearice_memory_pool_reserved_bytes`, `clearice_memory_pool_limit_bytes`).
    pub fn report_memory_pool(&self) {
        let pool = Arc::clone(&self.runtime.memory_pool);
        clearice_metrics::watch_memory_pool(move || {
            let limit = match pool.memory_limit() {
                datafusion::execution::memory_pool::MemoryLimit::Finite(n) => Some(n),
                _ => None,
            };
            (pool.reserved(), limit)
        });
    }

    /// A new SQL session for `principal`, connected from `client` (for the audit log:
    /// `repl`, `cli`, `slt`, or a network address). The principal is fixed for the
    /// session's life: no SQL statement can change it.
    pub fn session_for(&self, principal: &str, client: &str) -> Session {
        self.session_as(Caller::local(principal, client))
    }

    /// A local session (as [`Engine::session_for`]) that starts with `config` instead of
    /// ClearIce's session options: sqllogictest runs files written for DataFusion with
    /// the options DataFusion's runner uses. Policy, audit and keys apply as usual.
    pub fn session_with_config(
        &self,
        principal: &str,
        client: &str,
        config: SessionConfig,
    ) -> Session {
        self.build_session(Caller::local(principal, client), Some(config))
    }

    /// A session for a network principal (Flight SQL): confined to catalog tables and the
    /// policy's file areas, `SET` limited to [`SETTABLE_OPTIONS`], no DDL or DML, and
    /// `[server.limits]` applied.
    pub fn network_session(&self, principal: &str, client: &str) -> Session {
        self.session_as(Caller::network(principal, client, None))
    }

    /// The session of `caller`, built once at its front door: a [`FrontEnd::FlightSql`]
    /// caller is confined (catalog tables and the policy's file areas, `SET` limited to
    /// [`SETTABLE_OPTIONS`], no DDL or DML, `[server.limits]`); its provider calls carry
    /// its own token when it passed one.
    pub fn session_as(&self, caller: Caller) -> Session {
        self.build_session(caller, None)
    }

    /// Whether any configured crypto provider takes per-user tokens (remote providers).
    pub fn takes_provider_tokens(&self) -> bool {
        !self.config.providers.is_empty()
    }

    fn build_session(&self, caller: Caller, stock: Option<SessionConfig>) -> Session {
        let principal = caller.principal();
        let client = caller.client();
        let confined = caller.front() == FrontEnd::FlightSql || self.config.shell.confine;
        let limits = self
            .config
            .server
            .as_ref()
            .map(|s| s.limits.clone())
            .unwrap_or_default();
        let stock_session = stock.is_some();
        let config = match stock {
            Some(config) => config,
            None => {
                let mut config = SessionConfig::new()
                    .with_information_schema(true)
                    .with_option_extension(ClearIceOptions::default());
                if confined && let Some(n) = limits.query_parallelism {
                    config = config.with_target_partitions(n.max(1));
                }
                // `pushdown_filters` stays DataFusion's default (off): measured with
                // benches/compare, late materialization lost on a 1 % filter on a scattered
                // column (+9-30 %) and on a join's dynamic filter (+12-20 %), and won only on
                // TopK (-25 %). `SET datafusion.execution.parquet.pushdown_filters = true`
                // turns it on per session. Join and TopK dynamic filters are applied to
                // rows above the scan instead (`RowLevelDynamicFilters`).
                let optimizer = &mut config.options_mut().optimizer;
                optimizer.hash_join_single_partition_threshold = HASH_JOIN_COLLECT_BYTES;
                optimizer.hash_join_single_partition_threshold_rows = HASH_JOIN_COLLECT_ROWS;
                dynamic_rows::dynamic_filter_defaults(optimizer);
                config
            }
        };
        // Per-session runtime: shares memory, disk and object stores, but not the
        // metadata cache (decrypted footers must not cross principals) nor the
        // encryption factory (it is bound to the principal's right to decrypt files).
        let files_scope = if self.policy.may_decrypt_files(principal) {
            KeyScope::All
        } else {
            KeyScope::None(format!(
                "principal '{principal}' may not decrypt files outside the catalog (policy [files] decrypt)"
            ))
        };
        // Standalone Parquet files (`STORED AS PARQUET`, files by path) are read through
        // the decrypting reader, as catalog tables are.
        let files_keys = ScanKeys::new(caller.grant(files_scope), &self.crypto);
        let guard =
            confined.then(|| Arc::new(Confinement::new(&self.policy, &self.area_roots, &caller)));
        let memory_pool: Arc<dyn datafusion::execution::memory_pool::MemoryPool> =
            match (confined, limits.query_memory()) {
                (true, Some(limit)) => Arc::new(clearice_access::limits::QueryMemoryPool::new(
                    Arc::clone(&self.runtime.memory_pool),
                    limit,
                )),
                _ => Arc::clone(&self.runtime.memory_pool),
            };
        let bounded = matches!(
            memory_pool.memory_limit(),
            datafusion::execution::memory_pool::MemoryLimit::Finite(_)
        );
        let object_store_registry: Arc<dyn ObjectStoreRegistry> = match &guard {
            // `file://` confined to the areas; catalog data through its own store.
            Some(g) => {
                let reg = LakeRegistry::new(self.stores.clone(), false);
                let catalog_url = url::Url::parse(CATALOG_STORE_URL).expect("static URL");
                if let Ok(store) = self.runtime.object_store_registry.get_store(&catalog_url) {
                    reg.register_store(&catalog_url, store);
                }
                reg.register_store(&url::Url::parse("file://").expect("static URL"), g.store());
                Arc::new(reg)
            }
            None => Arc::clone(&self.runtime.object_store_registry),
        };
        // A session never falls back to the shared metadata cache: if its own cannot be
        // made, every statement of the session fails instead.
        let (cache_manager, mut setup_error) = match CacheManager::try_new(
            &CacheManagerConfig::default(),
        ) {
            Ok(c) => (c, None),
            Err(e) => (
                Arc::clone(&self.runtime.cache_manager),
                Some(format!(
                    "session of '{principal}' unusable: its private metadata cache could not be created: {e}"
                )),
            ),
        };
        let runtime = Arc::new(RuntimeEnv {
            memory_pool,
            disk_manager: Arc::clone(&self.runtime.disk_manager),
            cache_manager,
            object_store_registry,
            parquet_encryption_factory_registry: Arc::new(EncryptionFactoryRegistry::default()),
        });
        let mut state = SessionStateBuilder::new()
            .with_config(config)
            .with_runtime_env(runtime)
            .with_default_features()
            // A table read as of a snapshot is planned only from what the session opened
            // for the statement; DataFusion's own planner would ignore the clause.
            .with_relation_planners(vec![Arc::new(
                clearice_iceberg::travel::TravelPlanner::default(),
            )])
            .build();
        // Under a bounded pool (`[execution] memory_limit_mb`, a Flight session's
        // `query_memory_mb`), hash joins charged for what they hold (see `compact`): it
        // refused joins that fit in a quarter of it. Distributed plans too: their joins run
        // under each worker's own pool. Other sessions keep DataFusion's plans as they are.
        let mut rules = SessionStateBuilder::new_from_existing(state);
        if bounded || self.coordinator.is_some() {
            rules = rules.with_physical_optimizer_rule(Arc::new(
                clearice_access::compact::CompactJoinBuilds,
            ));
        }
        if confined {
            rules = rules.with_physical_optimizer_rule(Arc::new(clearice_access::fair::FairJoins));
        }
        // Row-level filters not for distributed plans (their scans run on workers), nor for
        // stock sessions (DataFusion's own plans, as its sqllogictest files expect).
        if !stock_session {
            rules = rules.with_physical_optimizer_rule(Arc::new(match &self.coordinator {
                None => RowLevelDynamicFilters::new(),
                Some(_) => RowLevelDynamicFilters::pruning_only(),
            }));
        }
        state = rules.build();
        if let Some(c) = &self.coordinator {
            state = c.distribute(state);
        }
        if let Err(e) = state.register_file_format(
            Arc::new(
                DecryptingParquetFormatFactory::new(files_keys).with_stores(self.stores.clone()),
            ),
            true,
        ) {
            setup_error.get_or_insert(format!(
                "session of '{principal}' unusable: the decrypting Parquet format could not be registered: {e}"
            ));
        }
        let ctx = SessionContext::new_with_state(state);
        let access = Arc::new(
            SessionAccess::new(
                caller.clone(),
                Arc::clone(&self.policy),
                Arc::clone(&self.resolver),
                Arc::clone(&self.providers),
            )
            .with_mask_key(self.mask_key.clone()),
        );
        for (name, provider) in &self.catalogs {
            let catalog = SessionCatalogProvider::new(Arc::clone(provider), Arc::clone(&access));
            ctx.register_catalog(name, Arc::new(catalog));
        }
        tracing::debug!(principal, client, confined, "session opened");
        // Files by path (`SELECT * FROM 'f.parquet'`) are a ClearIce session feature; a
        // stock DataFusion session does not have them (a table named like a directory in
        // the working directory would resolve to it).
        let ctx = match (&guard, stock_session) {
            (Some(g), _) => url_tables(ctx, Some(Arc::clone(g))),
            (None, false) => url_tables(ctx, None),
            (None, true) => ctx,
        };
        let mut session = Session::new(
            ctx,
            access,
            self.audit.clone(),
            self.catalogs.iter().map(|(_, c)| Arc::clone(c)).collect(),
        );
        session.setup_error = setup_error;
        // A Flight SQL user's names resolve in the configured catalog and schema (the only
        // catalog by default, not DataFusion's empty in-memory one).
        if caller.front() == FrontEnd::FlightSql {
            let unset = ServerConfig::default();
            let server = self.config.server.as_ref().unwrap_or(&unset);
            let (catalog, schema) =
                server.namespace_of(principal, self.catalogs.iter().map(|(n, _)| n.as_str()));
            session.set_namespace(catalog, schema);
        }
        if let Some(g) = guard {
            session.confine(
                g,
                clearice_access::limits::SessionLimits {
                    config: limits,
                    permits: Arc::clone(&self.permits),
                },
            );
        }
        session
    }

    /// A new SQL session for `principal` (client `embedded`).
    pub fn session(&self, principal: &str) -> Session {
        self.session_for(principal, "embedded")
    }
}

/// `SessionContext::enable_url_table` with ClearIce's factory: errors say why a path
/// cannot be read; with `guard`, only paths inside the principal's readable areas.
fn url_tables(ctx: SessionContext, guard: Option<Arc<Confinement>>) -> SessionContext {
    use datafusion::catalog::{DynamicFileCatalog, UrlTableFactory};
    let current = Arc::clone(ctx.state_ref().read().catalog_list());
    let factory = Arc::new(clearice_access::confine::ConfinedUrlTableFactory::new(
        guard,
    ));
    let list = Arc::new(DynamicFileCatalog::new(
        current,
        Arc::clone(&factory) as Arc<dyn UrlTableFactory>,
    ));
    let session_id = ctx.session_id();
    let ctx: SessionContext = ctx
        .into_state_builder()
        .with_session_id(session_id)
        .with_catalog_list(list)
        .build()
        .into();
    factory.set_state(ctx.state_weak_ref());
    ctx
}

fn resolve_sqlite_uri(config: &Config, uri: &str) -> String {
    // `sqlite:relative.db` resolves against the config directory.
    match uri.strip_prefix("sqlite:") {
        Some(rest) if !rest.starts_with('/') && !rest.starts_with(':') => {
            format!("sqlite://{}", config.resolve(rest.as_ref()).display())
        }
        _ => uri.to_owned(),
    }
}

/// The client that asks REST catalog `name` for read restrictions, authenticated as the
/// catalog client is (`props`: `token`, or `credential` = `client_id:secret` exchanged at
/// `oauth2-server-uri`, `header.*`), or per principal with `tokens`.
fn rest_restrictions(
    name: &str,
    cat: &CatalogConfig,
    props: &HashMap<String, String>,
    tokens: Option<std::collections::BTreeMap<String, AccessToken>>,
) -> Result<clearice_iceberg::restrictions::RestRestrictions> {
    use clearice_iceberg::restrictions::{EngineCredential, RestRestrictions};
    let uri = cat.uri.trim_end_matches('/');
    let engine = if let Some(t) = props.get("token") {
        EngineCredential::Token(AccessToken::new(t.as_str()))
    } else if let Some(c) = props.get("credential") {
        let (id, secret) = c.split_once(':').unwrap_or(("", c.as_str()));
        EngineCredential::ClientCredentials {
            id: id.to_owned(),
            secret: AccessToken::new(secret),
            server: props
                .get("oauth2-server-uri")
                .cloned()
                .unwrap_or_else(|| format!("{uri}/v1/oauth/tokens")),
            scope: props
                .get("scope")
                .cloned()
                .unwrap_or_else(|| "catalog".into()),
        }
    } else {
        EngineCredential::None
    };
    let headers = props
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("header.")?.to_owned(), v.clone())))
        .collect();
    Ok(RestRestrictions::new(
        name,
        uri,
        cat.warehouse.as_deref(),
        headers,
        props.get("prefix").map(String::as_str),
        engine,
        tokens,
    )?)
}
