//! Session building for ClearIce: reads `clearice.toml`, opens the Iceberg catalogs,
//! sets up key resolution, and builds DataFusion sessions in which encrypted Iceberg
//! tables and standalone PME Parquet files decrypt transparently.
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
mod config;
mod error;
mod executor;
mod guard;
mod rotate;
mod route;
mod session;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::prelude::BASE64_STANDARD;
use clearice_access::{SessionAccess, SessionCatalogProvider};
use clearice_crypto::{
    CallContext, KeyScope, LocalProvider, ProviderRef, Providers, RemoteConfig, RemoteCredential,
    RemoteProvider,
};
use clearice_crypto::{DEFAULT_KEY_CACHE_TTL, KeyResolver, ScanGrant, SecretKey};
use clearice_iceberg::{
    IcebergCatalogProvider, open_hms_catalog, open_rest_catalog, open_sql_catalog_with,
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
pub use clearice_cluster::{ClearIceCodec, ClusterError, MIN_SECRET_BYTES, TaskSigner};
pub use clearice_crypto::AccessToken;
pub use clearice_iceberg::Error as TableError;
pub use clearice_iceberg::travel::rewrite_sql as rewrite_time_travel;
pub use clearice_storage::{Requests as StorageRequests, S3Options, Secret};
pub use config::{
    AuditConfig, CatalogConfig, CatalogKind, ClusterConfig, Config, ExplicitKeysConfig, KmsConfig,
    KmsKind, LimitsConfig, PolicyConfig, ProviderConfig, ProviderKind, ServerConfig, ServerUser,
    ShellConfig,
};
pub use error::{Error, ErrorClass, Result, classify, message_of};
pub use executor::CpuExecutor;
pub use rotate::{RotationReport, rotate_master_key};
pub use session::{CATALOG_LISTING_MAX_AGE, QueryOutput, Session};

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
    /// Sends scans to workers (after [`Engine::distribute`]).
    coordinator: Option<clearice_cluster::Coordinator>,
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
            signer,
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
            let provider = IcebergCatalogProvider::try_new(
                name,
                Arc::clone(&ice),
                Arc::clone(&crypto),
                stores.clone(),
                committer,
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
        let workers = clearice_cluster::Workers::start(&cluster.workers, Arc::clone(signer))
            .map_err(cluster_err)?;
        self.coordinator = Some(clearice_cluster::Coordinator {
            workers,
            signer: Arc::clone(signer),
            partitions_per_worker: cluster.partitions_per_worker,
        });
        Ok(self)
    }

    /// The worker service of `clearice worker`: runs the stages coordinators of the same
    /// cluster (same secret) send, planning scans with this engine's catalogs and keys.
    pub fn worker_service(&self) -> Result<datafusion_distributed::Worker> {
        let Some(signer) = &self.signer else {
            return Err(Error::ConfigValue {
                path: self.config.source.clone(),
                key: "cluster".into(),
                reason: "a worker needs [cluster] secret_file".into(),
            });
        };
        Ok(clearice_cluster::worker(clearice_cluster::WorkerSessions {
            runtime: Arc::clone(&self.runtime),
            codec: Arc::new(self.worker_codec(Arc::clone(signer))),
        }))
    }

    /// Serves [`Engine::worker_service`] on `listener` until `shutdown` completes; a call
    /// without a credential of the cluster secret is refused before its message is read.
    pub async fn serve_worker(
        &self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<()> {
        let worker = self.worker_service()?;
        let signer = self
            .signer
            .clone()
            .ok_or_else(|| Error::Worker("no cluster secret".into()))?;
        clearice_cluster::serve(worker, signer, listener, shutdown)
            .await
            .map_err(|e| Error::Worker(e.to_string()))
    }

    /// The codec this engine's worker decodes plans with (scans verified with `signer`,
    /// planned with this engine's catalogs and keys).
    pub fn worker_codec(&self, signer: Arc<TaskSigner>) -> ClearIceCodec {
        let builder = Arc::new(clearice_cluster::WorkerScans {
            catalogs: self.catalogs.clone(),
            providers: Arc::clone(&self.providers),
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
                let mut config = SessionConfig::new().with_information_schema(true);
                if confined && let Some(n) = limits.query_parallelism {
                    config = config.with_target_partitions(n.max(1));
                }
                // `pushdown_filters` stays DataFusion's default (off): measured with
                // benches/compare, late materialization lost on a 1 % filter on a scattered
                // column (+9-30 %) and on a join's dynamic filter (+12-20 %), and won only on
                // TopK (-25 %). `SET datafusion.execution.parquet.pushdown_filters = true`
                // turns it on per session.
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
            .build();
        if confined {
            state = SessionStateBuilder::new_from_existing(state)
                .with_physical_optimizer_rule(Arc::new(clearice_access::fair::FairJoins))
                .build();
        }
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
        let access = Arc::new(SessionAccess::new(
            caller.clone(),
            Arc::clone(&self.policy),
            Arc::clone(&self.resolver),
            Arc::clone(&self.providers),
        ));
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

/// What [`Engine::open`] reads from local files: blocking, so it runs on a blocking thread.
struct LocalParts {
    resolver: Arc<KeyResolver>,
    remote: Vec<(String, RemoteConfig)>,
    policy: Policy,
    audit: Option<Arc<AuditLog>>,
    area_roots: Vec<(
        clearice_policy::Area,
        std::path::PathBuf,
        std::path::PathBuf,
    )>,
    /// `[storage.s3]` with its secret read and AWS's environment applied.
    s3: S3Options,
    /// REST catalogs' client properties (secrets read from their files).
    catalog_props: HashMap<String, HashMap<String, String>>,
    /// `[cluster]`: the signer over its secret.
    signer: Option<TaskSigner>,
}

impl LocalParts {
    #[expect(
        clippy::disallowed_methods,
        reason = "startup file reads; Engine::open runs this on a blocking thread"
    )]
    fn load(config: &Config) -> Result<Self> {
        let (kms, ttl) = match &config.kms {
            Some(k) => (Some(k.open(|p| config.resolve(p))?), k.cache_ttl()),
            None => (None, DEFAULT_KEY_CACHE_TTL),
        };
        let mut remote = Vec::new();
        for (name, p) in &config.providers {
            remote.push((name.clone(), remote_config(config, name, p)?));
        }
        let explicit = match &config.explicit_keys {
            Some(e) => load_explicit_keys(config, &config.resolve(&e.path))?,
            None => HashMap::new(),
        };
        let resolver = Arc::new(KeyResolver::new(kms, explicit, ttl));
        let mut policy_dir = config.base_dir.clone();
        let policy = match &config.policy {
            Some(p) => {
                let path = config.resolve(&p.path);
                policy_dir = path.parent().map(Into::into).unwrap_or_default();
                let text = std::fs::read_to_string(&path).map_err(|e| Error::ConfigValue {
                    path: config.source.clone(),
                    key: "policy.path".into(),
                    reason: format!("'{}': {e}", path.display()),
                })?;
                Policy::parse(&text, &path.display().to_string())?
            }
            None => Policy::open("none"),
        };
        let audit = match &config.audit {
            Some(a) => Some(Arc::new(AuditLog::open(&config.resolve(&a.path))?)),
            None => None,
        };
        let area_roots = Confinement::resolve_roots(&policy, &policy_dir);
        // Every provider the policy names must be configured.
        for (tname, t) in policy.tables() {
            let named = t.provider.iter().map(|p| (p, String::new())).chain(
                t.columns
                    .iter()
                    .filter_map(|(c, cp)| cp.provider.as_ref().map(|p| (p, format!(".{c}")))),
            );
            for (p, column) in named {
                if p != clearice_crypto::LOCAL && !config.providers.contains_key(p) {
                    return Err(Error::ConfigValue {
                        path: policy.source().to_owned(),
                        key: format!("tables.\"{tname}\"{column}.provider"),
                        reason: format!(
                            "provider '{p}' is not configured (add [providers.{p}] to {})",
                            config.source
                        ),
                    });
                }
            }
        }
        let read_secret = |key: String, path: &std::path::Path| {
            let path = config.resolve(path);
            std::fs::read_to_string(&path)
                .map(|t| t.trim().to_owned())
                .map_err(|e| Error::ConfigValue {
                    path: config.source.clone(),
                    key,
                    reason: format!("'{}': {e}", path.display()),
                })
        };
        let mut s3 = S3Options::default();
        if let Some(c) = &config.storage.s3 {
            s3.endpoint = c.endpoint.clone();
            s3.region = c.region.clone();
            s3.path_style = c.path_style;
            s3.profile = c.profile.clone();
            s3.anonymous = c.anonymous;
            s3.timeout = c.timeout_s.map(Duration::from_secs);
            s3.retries = c.retries;
            if let Some(f) = &c.ca_file {
                let path = config.resolve(f);
                s3.ca_pem = Some(std::fs::read(&path).map_err(|e| Error::ConfigValue {
                    path: config.source.clone(),
                    key: "storage.s3.ca_file".into(),
                    reason: format!("'{}': {e}", path.display()),
                })?);
            }
            if let (Some(id), Some(f)) = (&c.access_key_id, &c.secret_access_key_file) {
                s3.access_key_id = Some(id.clone());
                s3.secret_access_key = Some(Secret::new(read_secret(
                    "storage.s3.secret_access_key_file".into(),
                    f,
                )?));
            }
        }
        let s3 = s3.with_environment();
        let mut catalog_props = HashMap::new();
        for (name, cat) in &config.catalogs {
            let mut props: HashMap<String, String> = cat.properties.clone().into_iter().collect();
            if let Some(f) = &cat.credential_file {
                props.insert(
                    "credential".into(),
                    read_secret(format!("catalogs.{name}.credential_file"), f)?,
                );
            }
            if let Some(f) = &cat.token_file {
                props.insert(
                    "token".into(),
                    read_secret(format!("catalogs.{name}.token_file"), f)?,
                );
            }
            if let Some(u) = &cat.oauth2_server_uri {
                props.insert("oauth2-server-uri".into(), u.clone());
            }
            if let Some(sc) = &cat.scope {
                props.insert("scope".into(), sc.clone());
            }
            catalog_props.insert(name.clone(), props);
        }
        let signer = match &config.cluster {
            Some(c) => {
                let path = config.resolve(&c.secret_file);
                let err = |reason: String| Error::ConfigValue {
                    path: config.source.clone(),
                    key: "cluster.secret_file".into(),
                    reason: format!("'{}': {reason}", path.display()),
                };
                let secret =
                    zeroize::Zeroizing::new(std::fs::read(&path).map_err(|e| err(e.to_string()))?);
                let ttl = Duration::from_secs(c.task_ttl_s.unwrap_or(3600));
                Some(TaskSigner::new(secret.trim_ascii(), ttl).map_err(err)?)
            }
            None => None,
        };
        Ok(Self {
            resolver,
            policy,
            audit,
            area_roots,
            remote,
            s3,
            catalog_props,
            signer,
        })
    }
}

/// A `[providers.NAME]` section as the remote provider's settings (reads its files:
/// blocking).
#[expect(
    clippy::disallowed_methods,
    reason = "startup file reads; called by LocalParts::load on a blocking thread"
)]
fn remote_config(config: &Config, name: &str, p: &ProviderConfig) -> Result<RemoteConfig> {
    let read = |key: &str, path: &std::path::Path| {
        let path = config.resolve(path);
        std::fs::read(&path).map_err(|e| Error::ConfigValue {
            path: config.source.clone(),
            key: format!("providers.{name}.{key}"),
            reason: format!("'{}': {e}", path.display()),
        })
    };
    let mut r = RemoteConfig::new(name, p.url.clone());
    if let Some(ca) = &p.ca_file {
        r.ca_pem = Some(read("ca_file", ca)?);
    }
    r.credential = match (&p.token_file, &p.hs256_secret_file) {
        (Some(_), Some(_)) => {
            return Err(Error::ConfigValue {
                path: config.source.clone(),
                key: format!("providers.{name}"),
                reason: "set token_file or hs256_secret_file, not both".into(),
            });
        }
        (Some(t), None) => {
            let text = String::from_utf8(read("token_file", t)?).unwrap_or_default();
            RemoteCredential::Bearer(AccessToken::new(text.trim()))
        }
        (None, Some(s)) => RemoteCredential::Hs256 {
            secret: SecretKey::from_bytes(read("hs256_secret_file", s)?.trim_ascii().to_vec()),
            subject: p.subject.clone().unwrap_or_else(|| "clearice".into()),
            audience: p
                .audience
                .clone()
                .unwrap_or_else(|| "clearice-crypto".into()),
        },
        (None, None) => RemoteCredential::None,
    };
    if let Some(t) = p.timeout_s.filter(|t| *t > 0.0) {
        r.timeout = Duration::from_secs_f64(t);
    }
    if let Some(n) = p.max_concurrent {
        r.max_concurrent = n.max(1);
    }
    if let Some(n) = p.retries {
        r.retries = n;
    }
    if let Some(mb) = p.max_request_mb {
        r.max_request_bytes = mb.max(1) << 20;
    }
    Ok(r)
}

#[expect(
    clippy::disallowed_methods,
    reason = "startup file read; called by LocalParts::load on a blocking thread"
)]
fn load_explicit_keys(
    config: &Config,
    path: &std::path::Path,
) -> Result<HashMap<String, SecretKey>> {
    let bad = |reason: String| Error::ConfigValue {
        path: config.source.clone(),
        key: "explicit_keys.path".into(),
        reason,
    };
    let text =
        std::fs::read_to_string(path).map_err(|e| bad(format!("'{}': {e}", path.display())))?;
    let map: HashMap<String, String> = serde_json::from_str(&text).map_err(|e| {
        bad(format!(
            "'{}' is not a JSON object of base64 keys: {e}",
            path.display()
        ))
    })?;
    map.into_iter()
        .map(|(id, b64)| {
            let key = BASE64_STANDARD
                .decode(b64.trim())
                .map_err(|_| bad(format!("key '{id}' is not base64")))?;
            if !matches!(key.len(), 16 | 24 | 32) {
                return Err(bad(format!(
                    "key '{id}' has {} bytes; expected 16, 24 or 32",
                    key.len()
                )));
            }
            Ok((id, SecretKey::from_bytes(key)))
        })
        .collect()
}

impl Engine {
    /// Whether each provider the table's policy names is reachable and knows the
    /// master keys routed to it.
    async fn check_providers(
        &self,
        table: &str,
        tpol: &clearice_policy::TablePolicy,
    ) -> Vec<String> {
        let providers = tpol.key_providers();
        let mut by_provider: std::collections::BTreeMap<&str, Vec<(String, &str)>> =
            Default::default();
        for (col, c) in &tpol.columns {
            if let Some(k) = &c.master_key {
                by_provider
                    .entry(providers[k].as_str())
                    .or_default()
                    .push((k.clone(), col));
            }
        }
        let context = CallContext {
            principal: "clearice-policy-check".into(),
            application: [("table".to_owned(), table.to_owned())].into(),
            ..Default::default()
        };
        let mut problems = Vec::new();
        for (name, keys) in by_provider {
            let Some(provider) = self.providers.get(name) else {
                continue;
            };
            let ids: Vec<String> = keys.iter().map(|(k, _)| k.clone()).collect();
            match provider.check_access(&context, &ids).await {
                Err(e) => problems.push(format!("{table}: {e}")),
                Ok(answers) => {
                    for (k, col) in &keys {
                        if answers.get(k) == Some(&clearice_crypto::KeyAccess::Unknown) {
                            problems.push(format!(
                                "{table}.{col}: crypto provider '{name}' does not know master key '{k}'"
                            ));
                        }
                    }
                }
            }
        }
        problems
    }

    /// Checks the policy against the catalogs (`clearice policy check`): every table and
    /// column it names exists, every mask applies to its column's type, and every column
    /// encrypted under its own key in the table's current data is declared with that
    /// `master_key` (reading one data file's footer; no column key is requested), the
    /// table's files can be planned, and `SELECT *` of it plans for every user of the
    /// policy (a refusal by the policy is fine; any other failure is a problem), and every
    /// crypto provider it names answers and knows the master keys routed to it.
    /// Returns the problems found, one line each.
    pub async fn check_policy(&self) -> Vec<String> {
        use futures::TryStreamExt;
        let mut problems = Vec::new();
        for (name, tpol) in self.policy.tables() {
            let parts: Vec<&str> = name.split('.').collect();
            let Some(cat) = self.iceberg.get(parts[0]) else {
                problems.push(format!("{name}: no catalog '{}' in the config", parts[0]));
                continue;
            };
            // catalog.namespace.table, the namespace of any depth.
            let ns = parts[1..parts.len() - 1]
                .iter()
                .map(|p| (*p).to_owned())
                .collect::<Vec<_>>();
            let Ok(ns) = iceberg::NamespaceIdent::from_vec(ns) else {
                problems.push(format!("{name}: not catalog.namespace.table"));
                continue;
            };
            let ident = iceberg::TableIdent::new(ns, parts[parts.len() - 1].into());
            let table = match cat.load_table(&ident).await {
                Ok(t) => t,
                Err(e) => {
                    problems.push(format!("{name}: {}", one_line(&e)));
                    continue;
                }
            };
            let schema =
                match clearice_iceberg::arrow_schema(name, table.metadata().current_schema()) {
                    Ok(s) => s,
                    Err(e) => {
                        problems.push(one_line(&e));
                        continue;
                    }
                };
            let cols: Vec<(String, clearice_policy::ColumnKind)> = schema
                .fields()
                .iter()
                .map(|f| {
                    (
                        f.name().clone(),
                        clearice_access::column_kind(f.data_type()),
                    )
                })
                .collect();
            problems.extend(
                self.policy
                    .check_table(name, &cols)
                    .iter()
                    .map(|e| e.to_string()),
            );
            problems.extend(self.check_providers(name, tpol).await);
            for user in self.policy.user_names() {
                let session = self.session_for(user, "policy-check");
                if let Err(e) = session.sql_plan(&format!("SELECT * FROM {name}")).await
                    && classify(&e) != ErrorClass::Denied
                {
                    problems.push(format!(
                        "{name}: SELECT * does not plan for user '{user}': {}",
                        message_of(&e)
                    ));
                }
            }
            let planned = match table.scan().select_all().build() {
                Ok(scan) => match scan.plan_files().await {
                    Ok(s) => s.try_collect::<Vec<_>>().await,
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            };
            let tasks = match planned {
                Ok(t) => t,
                Err(e) => {
                    problems.push(format!("{name}: cannot plan its files: {}", one_line(&e)));
                    continue;
                }
            };
            let Some(task) = tasks.first() else { continue };
            let path = task.data_file_path.clone();
            let keys = self.file_column_keys(&path).await;
            match keys {
                Ok(keys) => {
                    for (col, key) in keys {
                        let top = col.split('.').next().unwrap_or(&col);
                        let declared = tpol.columns.get(top).and_then(|c| c.master_key.clone());
                        if let Some(k) = key
                            && declared.as_deref() != Some(k.as_str())
                        {
                            problems.push(format!(
                                "{name}.{top}: encrypted under master key '{k}' in '{path}', but the policy declares {}",
                                declared.map(|d| format!("master_key = '{d}'")).unwrap_or_else(|| "no master_key".into())
                            ));
                        }
                    }
                }
                Err(e) => problems.push(format!("{name}: cannot read '{path}': {e}")),
            }
        }
        problems.extend(self.check_unnamed_tables().await);
        problems
    }

    /// Catalog tables the policy does not name whose data has encrypted columns: they
    /// are denied to everyone (fail closed) until the policy names them (one data file's
    /// footer read per table; no column key is requested).
    async fn check_unnamed_tables(&self) -> Vec<String> {
        use futures::TryStreamExt;
        let mut problems = Vec::new();
        for (cat_name, cat) in &self.iceberg {
            let mut pending: Vec<Option<iceberg::NamespaceIdent>> = vec![None];
            let mut tables = Vec::new();
            while let Some(parent) = pending.pop() {
                let Ok(children) = cat.list_namespaces(parent.as_ref()).await else {
                    continue;
                };
                for ns in children {
                    if let Ok(t) = cat.list_tables(&ns).await {
                        tables.extend(t);
                    }
                    pending.push(Some(ns));
                }
            }
            for ident in tables {
                let name = format!(
                    "{cat_name}.{}.{}",
                    ident.namespace().clone().inner().join("."),
                    ident.name()
                );
                if self.policy.table(&name).is_some() {
                    continue;
                }
                let Ok(table) = cat.load_table(&ident).await else {
                    continue;
                };
                let tasks = match table.scan().select_all().build() {
                    Ok(scan) => match scan.plan_files().await {
                        Ok(s) => s.try_collect::<Vec<_>>().await.unwrap_or_default(),
                        Err(_) => vec![],
                    },
                    Err(_) => vec![],
                };
                let Some(task) = tasks.first() else { continue };
                if let Ok(keys) = self.file_column_keys(&task.data_file_path).await {
                    let encrypted: Vec<String> = keys
                        .into_iter()
                        .filter_map(|(c, k)| Some(format!("'{c}' (master key '{}')", k?)))
                        .collect();
                    if !encrypted.is_empty() {
                        problems.push(format!(
                            "{name}: not named by the policy, but its columns {} are encrypted: they are denied to everyone until the policy names the table and their master_key",
                            encrypted.join(", ")
                        ));
                    }
                }
            }
        }
        problems
    }
}
