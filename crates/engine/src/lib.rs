//! Session building for ClearIce: reads `clearice.toml`, opens the Iceberg catalogs,
//! sets up key resolution, and builds DataFusion sessions in which encrypted Iceberg
//! tables and standalone PME Parquet files decrypt transparently.
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! let config = clearice_engine::Config::load("clearice.toml".as_ref())?;
//! let engine = clearice_engine::Engine::open(config).await?;
//! let ctx = engine.session("alice");
//! ctx.sql("SELECT count(*) FROM lake.sales.customers").await?.show().await?;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

mod config;
pub mod demo;
mod error;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::prelude::BASE64_STANDARD;
use clearice_crypto::{DEFAULT_KEY_CACHE_TTL, KeyResolver, KeyringKms, Kms, SecretKey};
use clearice_table::{
    ENCRYPTION_FACTORY_ID, IcebergCatalogProvider, PmeEncryptionFactory, open_sql_catalog,
};
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::prelude::{SessionConfig, SessionContext};

pub use config::{CatalogConfig, CatalogKind, Config, ExplicitKeysConfig, KmsConfig, KmsKind};
pub use error::{Error, Result};

/// Process-wide state shared by all sessions: catalogs, keys, runtime.
#[derive(Debug)]
pub struct Engine {
    config: Config,
    catalogs: Vec<(String, Arc<IcebergCatalogProvider>)>,
    iceberg: HashMap<String, Arc<dyn iceberg::Catalog>>,
    factory: Arc<PmeEncryptionFactory>,
    runtime: Arc<RuntimeEnv>,
}

impl Engine {
    /// Opens every configured catalog and the KMS.
    pub async fn open(config: Config) -> Result<Self> {
        let (kms, ttl): (Option<Arc<dyn Kms>>, Duration) = match &config.kms {
            Some(k) => {
                let KmsKind::Keyring = k.kind;
                let path = k.path.as_ref().expect("validated at load");
                let ttl = k.key_cache_ttl_s.map(Duration::from_secs);
                (
                    Some(Arc::new(KeyringKms::from_file(&config.resolve(path))?)),
                    ttl.unwrap_or(DEFAULT_KEY_CACHE_TTL),
                )
            }
            None => (None, DEFAULT_KEY_CACHE_TTL),
        };
        let explicit = match &config.explicit_keys {
            Some(e) => load_explicit_keys(&config, &config.resolve(&e.path))?,
            None => HashMap::new(),
        };
        let resolver = Arc::new(KeyResolver::new(kms, explicit, ttl));
        let factory = Arc::new(PmeEncryptionFactory::new(resolver));
        let runtime = Arc::new(RuntimeEnv::default());
        runtime
            .register_parquet_encryption_factory(ENCRYPTION_FACTORY_ID, Arc::clone(&factory) as _);
        let mut catalogs = Vec::new();
        let mut iceberg = HashMap::new();
        for (name, cat) in &config.catalogs {
            let CatalogKind::Sql = cat.kind;
            let ice =
                open_sql_catalog(name, &resolve_sqlite_uri(&config, &cat.uri), &cat.warehouse)
                    .await?;
            let provider =
                IcebergCatalogProvider::try_new(name, Arc::clone(&ice), Arc::clone(&factory) as _)
                    .await?;
            catalogs.push((name.clone(), Arc::new(provider)));
            iceberg.insert(name.clone(), ice);
        }
        Ok(Self {
            config,
            catalogs,
            iceberg,
            factory,
            runtime,
        })
    }

    /// The config this engine was opened with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The Iceberg catalog named `name`.
    pub fn iceberg_catalog(&self, name: &str) -> Option<&Arc<dyn iceberg::Catalog>> {
        self.iceberg.get(name)
    }

    /// The key resolver (metrics: KMS calls).
    pub fn key_resolver(&self) -> &Arc<KeyResolver> {
        self.factory.resolver()
    }

    /// A new SQL session for `principal`. The principal is fixed for the session's life:
    /// no SQL statement can change it.
    pub fn session(&self, principal: &str) -> SessionContext {
        let mut config = SessionConfig::new().with_information_schema(true);
        config.options_mut().execution.parquet.pushdown_filters = true;
        let ctx = SessionContext::new_with_config_rt(config, Arc::clone(&self.runtime));
        {
            let state = ctx.state_ref();
            let mut state = state.write();
            state.table_options_mut().parquet.crypto.factory_id =
                Some(ENCRYPTION_FACTORY_ID.to_owned());
        }
        for (name, provider) in &self.catalogs {
            ctx.register_catalog(name, Arc::clone(provider) as _);
        }
        tracing::debug!(principal, "session opened");
        ctx.enable_url_table()
    }
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
