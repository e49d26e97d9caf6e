//! The interop lake as this crate sees it: a catalog, the KMS, and sessions of one
//! principal under a policy, with no engine around them.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use clearice_access::{Caller, SessionAccess, SessionCatalogProvider};
use clearice_crypto::{
    DEFAULT_KEY_CACHE_TTL, KeyResolver, KeyringKms, LocalProvider, ProviderRef, Providers,
};
use clearice_iceberg::{CATALOG_STORE_URL, IcebergCatalogProvider, open_sql_catalog_with};
use clearice_policy::Policy;
use clearice_storage::{LakeRegistry, LakeStores};
use clearice_testkit::matrix::{Lake, Principal};
use datafusion::arrow::array::RecordBatch;
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::prelude::{SessionConfig, SessionContext};

/// The interop lake's catalog and keys.
pub struct InteropLake {
    catalog: Arc<IcebergCatalogProvider>,
    pub resolver: Arc<KeyResolver>,
    providers: Arc<Providers>,
    runtime: Arc<RuntimeEnv>,
}

impl InteropLake {
    /// Opens the lake in `dir` (written by `make_fixtures.py`) with its keyring.
    pub async fn open(dir: &Path) -> Self {
        let stores = LakeStores::new(Default::default());
        let kms = KeyringKms::from_file(&dir.join("keyring.json")).unwrap();
        let resolver = Arc::new(KeyResolver::new(
            Some(Arc::new(kms)),
            HashMap::new(),
            DEFAULT_KEY_CACHE_TTL,
        ));
        let crypto: ProviderRef = Arc::new(LocalProvider::new(
            Arc::clone(&resolver),
            Some(stores.side_file_reader()),
        ));
        let providers = Arc::new(Providers::new(Arc::clone(&crypto), vec![]));
        let ice = open_sql_catalog_with(
            "lake",
            &format!("sqlite://{}/catalog.db", dir.display()),
            &format!("file://{}/warehouse", dir.display()),
            HashMap::new(),
            &stores,
        )
        .await
        .unwrap();
        let catalog = IcebergCatalogProvider::try_new(
            "lake",
            ice,
            crypto,
            stores.clone(),
            clearice_iceberg::commit::Committer::Unsupported {
                reason: "the policy provider's tests only read".into(),
            },
            None,
        )
        .await
        .unwrap();
        let runtime = RuntimeEnvBuilder::new()
            .with_object_store_registry(Arc::new(LakeRegistry::new(stores.clone(), true)))
            .build_arc()
            .unwrap();
        runtime.register_object_store(&url::Url::parse(CATALOG_STORE_URL).unwrap(), stores.local());
        Self {
            catalog: Arc::new(catalog),
            resolver,
            providers,
            runtime,
        }
    }

    /// A session of `principal` under `policy` (TOML text).
    pub fn session(&self, policy: &str, principal: &str) -> PolicySession {
        let policy = Arc::new(Policy::parse(policy, "policy.toml").unwrap());
        let access = Arc::new(SessionAccess::new(
            Caller::local(principal, "access-tests"),
            policy,
            Arc::clone(&self.resolver),
            Arc::clone(&self.providers),
        ));
        let ctx =
            SessionContext::new_with_config_rt(SessionConfig::new(), Arc::clone(&self.runtime));
        ctx.register_catalog(
            "lake",
            Arc::new(SessionCatalogProvider::new(
                Arc::clone(&self.catalog),
                access,
            )),
        );
        PolicySession(ctx)
    }
}

/// One principal's DataFusion context over the policy's catalog.
pub struct PolicySession(SessionContext);

impl PolicySession {
    /// Runs `sql` and collects it; the error as its message.
    pub async fn sql(&self, sql: &str) -> Result<Vec<RecordBatch>, String> {
        async { self.0.sql(sql).await?.collect().await }
            .await
            .map_err(|e: datafusion::error::DataFusionError| e.to_string())
    }
}

impl Principal for PolicySession {
    async fn query(&self, sql: &str) -> Result<Vec<RecordBatch>, String> {
        self.sql(sql).await
    }
}

impl Lake for InteropLake {
    type Session = PolicySession;
    async fn open(&self, policy: &str, _name: &str) -> (PolicySession, PolicySession) {
        (self.session(policy, "ua"), self.session(policy, "ub"))
    }
}

/// The interop lake, or `None` (the test skips loudly) outside `scripts/test.sh`.
pub async fn interop() -> Option<InteropLake> {
    let dir = clearice_testkit::interop_dir()?;
    Some(InteropLake::open(&dir).await)
}
