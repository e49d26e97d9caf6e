//! What `Engine::open` reads from local files (keyring, side files' key resolver, remote providers' credentials, policy, audit log, file areas, S3 secrets, the cluster secret): blocking, so it runs on a blocking thread.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::prelude::BASE64_STANDARD;
use clearice_crypto::{DEFAULT_KEY_CACHE_TTL, KeyResolver, SecretKey};
use clearice_crypto::{RemoteConfig, RemoteCredential};
use clearice_policy::Policy;

use crate::audit::AuditLog;
use crate::{
    AccessToken, Config, Confinement, Error, ProviderConfig, Result, S3Options, Secret, TaskSigner,
};

/// What [`Engine::open`] reads from local files: blocking, so it runs on a blocking thread.
pub(crate) struct LocalParts {
    pub(crate) resolver: Arc<KeyResolver>,
    pub(crate) remote: Vec<(String, RemoteConfig)>,
    pub(crate) policy: Policy,
    pub(crate) audit: Option<Arc<AuditLog>>,
    pub(crate) area_roots: Vec<(
        clearice_policy::Area,
        std::path::PathBuf,
        std::path::PathBuf,
    )>,
    /// `[storage.s3]` with its secret read and AWS's environment applied.
    pub(crate) s3: S3Options,
    /// REST catalogs' client properties (secrets read from their files).
    pub(crate) catalog_props: HashMap<String, HashMap<String, String>>,
    /// REST catalogs' `principal_tokens`, read.
    pub(crate) principal_tokens: HashMap<String, std::collections::BTreeMap<String, AccessToken>>,
    /// `[cluster]`: the signer over its secret.
    pub(crate) signer: Option<TaskSigner>,
    /// `[cluster] tls_*`: this process's certificate, its key and the cluster CA.
    pub(crate) cluster_tls: Option<clearice_cluster::ClusterTls>,
    /// The policy's `[masks] hmac_key_file`, read.
    pub(crate) mask_key: Option<Arc<clearice_crypto::MaskKey>>,
}

impl LocalParts {
    #[expect(
        clippy::disallowed_methods,
        reason = "startup file reads; Engine::open runs this on a blocking thread"
    )]
    pub(crate) fn load(config: &Config) -> Result<Self> {
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
        // The keyed hash mask's secret, relative to the policy file.
        let mask_key = match policy.hmac_key_file() {
            Some(f) => {
                let path = policy_dir.join(f);
                let shown = path.display().to_string();
                let bytes = std::fs::read(&path).map_err(|e| Error::ConfigValue {
                    path: policy.source().to_owned(),
                    key: "masks.hmac_key_file".into(),
                    reason: format!("'{shown}': {e}"),
                })?;
                Some(Arc::new(clearice_crypto::MaskKey::from_file_bytes(
                    &shown, bytes,
                )?))
            }
            None => None,
        };
        // Every provider the policy names must be configured.
        let tables = policy
            .tables()
            .map(|(tname, t)| (format!("tables.\"{tname}\""), t));
        let tags = policy
            .tags()
            .iter()
            .filter_map(|(n, t)| Some((format!("tags.{n}"), t.provider.as_ref()?)));
        for (key, p) in tags {
            if p != clearice_crypto::LOCAL && !config.providers.contains_key(p) {
                return Err(Error::ConfigValue {
                    path: policy.source().to_owned(),
                    key: format!("{key}.provider"),
                    reason: format!(
                        "provider '{p}' is not configured (add [providers.{p}] to {})",
                        config.source
                    ),
                });
            }
        }
        for (tname, t) in tables {
            let named = t.provider.iter().map(|p| (p, String::new())).chain(
                t.columns
                    .iter()
                    .filter_map(|(c, cp)| cp.provider.as_ref().map(|p| (p, format!(".{c}")))),
            );
            for (p, column) in named {
                if p != clearice_crypto::LOCAL && !config.providers.contains_key(p) {
                    return Err(Error::ConfigValue {
                        path: policy.source().to_owned(),
                        key: format!("{tname}{column}.provider"),
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
        let mut principal_tokens = HashMap::new();
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
            if !cat.principal_tokens.is_empty() {
                let mut tokens = std::collections::BTreeMap::new();
                for (principal, f) in &cat.principal_tokens {
                    let key = format!("catalogs.{name}.principal_tokens.{principal}");
                    tokens.insert(principal.clone(), AccessToken::new(read_secret(key, f)?));
                }
                principal_tokens.insert(name.clone(), tokens);
            }
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
        let cluster_tls = match &config.cluster {
            Some(c) if c.probe_interval_ms == Some(0) || c.query_timeout_s == Some(0) => {
                let key = if c.probe_interval_ms == Some(0) {
                    "cluster.probe_interval_ms"
                } else {
                    "cluster.query_timeout_s"
                };
                return Err(Error::ConfigValue {
                    path: config.source.clone(),
                    key: key.into(),
                    reason: "must be at least 1".into(),
                });
            }
            Some(c) => cluster_tls(config, c)?,
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
            principal_tokens,
            signer,
            cluster_tls,
            mask_key,
        })
    }
}

/// `[cluster] tls_cert`, `tls_key` and `tls_ca`, all three or none, read; worker URLs
/// checked against them (`https://` with TLS; plaintext `http://` only to loopback
/// unless `insecure`).
#[expect(
    clippy::disallowed_methods,
    reason = "startup file reads; Engine::open runs this on a blocking thread"
)]
fn cluster_tls(
    config: &Config,
    c: &crate::config::ClusterConfig,
) -> Result<Option<clearice_cluster::ClusterTls>> {
    let err = |key: &str, reason: String| Error::ConfigValue {
        path: config.source.clone(),
        key: format!("cluster.{key}"),
        reason,
    };
    let tls = match (&c.tls_cert, &c.tls_key, &c.tls_ca) {
        (None, None, None) => None,
        (Some(cert), Some(key), Some(ca)) => {
            let read = |name: &str, p: &std::path::Path| {
                let path = config.resolve(p);
                std::fs::read(&path)
                    .map(zeroize::Zeroizing::new)
                    .map_err(|e| err(name, format!("'{}': {e}", path.display())))
            };
            let (cert, key, ca) = (
                read("tls_cert", cert)?,
                read("tls_key", key)?,
                read("tls_ca", ca)?,
            );
            Some(
                clearice_cluster::ClusterTls::from_pem(&cert, &key, &ca)
                    .map_err(|r| err("tls_cert", r))?,
            )
        }
        _ => {
            return Err(err(
                "tls_cert",
                "tls_cert, tls_key and tls_ca are set together (mutual TLS) or not at all".into(),
            ));
        }
    };
    for w in &c.workers {
        let url = url::Url::parse(w).map_err(|e| err("workers", format!("'{w}': {e}")))?;
        let loopback = match url.host() {
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            Some(url::Host::Domain(d)) => d == "localhost",
            None => false,
        };
        match (url.scheme(), tls.is_some()) {
            ("https", true) => {}
            ("http", false) if loopback || c.insecure => {}
            ("http", false) => {
                return Err(err(
                    "workers",
                    format!(
                        "'{w}' is not on loopback: set tls_cert, tls_key and tls_ca (mutual TLS, https://), or insecure = true to send its traffic in plaintext"
                    ),
                ));
            }
            ("http", true) => {
                return Err(err(
                    "workers",
                    format!("'{w}': the cluster uses TLS, so worker URLs are https://"),
                ));
            }
            (_, false) if url.scheme() == "https" => {
                return Err(err(
                    "workers",
                    format!("'{w}' is https://: set tls_cert, tls_key and tls_ca"),
                ));
            }
            (s, _) => {
                return Err(err(
                    "workers",
                    format!("'{w}': scheme '{s}' (http or https)"),
                ));
            }
        }
    }
    Ok(tls)
}

/// A `[providers.NAME]` section as the remote provider's settings (reads its files:
/// blocking).
#[expect(
    clippy::disallowed_methods,
    reason = "startup file reads; called by LocalParts::load on a blocking thread"
)]
pub(crate) fn remote_config(
    config: &Config,
    name: &str,
    p: &ProviderConfig,
) -> Result<RemoteConfig> {
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
