//! `clearice.toml`: catalogs and key management. Relative paths are relative to the
//! config file's directory.
//!
//! ```toml
//! [catalogs.lake]
//! type = "sql"                        # Iceberg SQL catalog (SQLite or PostgreSQL)
//! uri = "sqlite:///abs/path/catalog.db"
//! warehouse = "file:///abs/path/warehouse"   # or s3://bucket/prefix
//!
//! [catalogs.rest]
//! type = "rest"                       # Iceberg REST catalog
//! uri = "http://localhost:8181"
//! warehouse = "s3://bucket/wh"        # optional: sent to the catalog
//! credential_file = "rest.cred"       # optional: `client_id:secret` (OAuth2)
//! [catalogs.rest.principal_tokens]    # optional: ask read restrictions per principal
//! alice = "alice.token"               # alice's own bearer token for the catalog
//!
//! [storage.s3]                        # optional: S3-compatible object storage
//! endpoint = "http://localhost:9000"  # default AWS; credentials from AWS_* / profile
//!
//! [kms]
//! type = "keyring"
//! path = "keyring.json"
//! key_cache_ttl_s = 600               # optional
//!
//! [explicit_keys]                     # optional: key metadata id -> key file
//! path = "explicit_keys.json"
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub use clearice_access::limits::LimitsConfig;

pub use clearice_crypto::{KmsConfig, KmsKind};

use crate::error::{Error, Result};

/// The whole config file.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Iceberg catalogs by name (the first part of `catalog.namespace.table`).
    #[serde(default)]
    pub catalogs: BTreeMap<String, CatalogConfig>,
    /// The KMS that unwraps PME key material.
    #[serde(default)]
    pub kms: Option<KmsConfig>,
    /// Crypto providers besides `local`, by name (the policy's `provider = "NAME"`).
    #[serde(default)]
    pub providers: BTreeMap<String, ProviderConfig>,
    /// Explicit keys for files whose key metadata is a bare key id.
    #[serde(default)]
    pub explicit_keys: Option<ExplicitKeysConfig>,
    /// The column policy (absent: everyone sees plaintext).
    #[serde(default)]
    pub policy: Option<PolicyConfig>,
    /// The audit log (absent: no audit records).
    #[serde(default)]
    pub audit: Option<AuditConfig>,
    /// The Flight SQL server (`clearice serve`).
    #[serde(default)]
    pub server: Option<ServerConfig>,
    /// The interactive shell and `-c`/`-f` runs.
    #[serde(default)]
    pub shell: ShellConfig,
    /// Object storage settings.
    #[serde(default)]
    pub storage: StorageConfig,
    /// Query execution of this process: its memory pool.
    #[serde(default)]
    pub execution: ExecutionConfig,
    /// Scale-out: the workers a coordinator sends scans to, and the secret that signs
    /// them (`clearice --distributed`, `clearice worker`).
    #[serde(default)]
    pub cluster: Option<ClusterConfig>,
    /// The Prometheus endpoint of `serve` and `worker` (`[metrics] addr`, token, TLS).
    #[serde(default)]
    pub metrics: clearice_metrics::MetricsConfig,
    /// Directory of the config file (relative paths resolve against it).
    #[serde(skip)]
    pub base_dir: PathBuf,
    /// Where the config was read from, for messages.
    #[serde(skip)]
    pub source: String,
}

/// One catalog.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogConfig {
    /// Catalog kind: `sql` (Iceberg SQL catalog on SQLite or PostgreSQL), `rest`
    /// (Iceberg REST catalog) or `hms` (Hive Metastore).
    #[serde(rename = "type")]
    pub kind: CatalogKind,
    /// `sql`: `sqlite:///abs/path.db`, `sqlite:relative.db` or `postgres://user@host/db`;
    /// `rest`: the catalog's base URL (`http://host:8181`, without `/v1`); `hms`: the
    /// metastore's `thrift://host:9083`.
    pub uri: String,
    /// Warehouse root URI (`file:///abs/path/warehouse`, `s3://bucket/prefix`); for
    /// `rest`, optional: the warehouse (or its name) the catalog is asked for.
    #[serde(default)]
    pub warehouse: Option<String>,
    /// `rest`: file holding the OAuth2 client credential `client_id:client_secret`.
    #[serde(default)]
    pub credential_file: Option<PathBuf>,
    /// `rest`: file holding a bearer token.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// `rest`: OAuth2 token endpoint (default the catalog's `/v1/oauth/tokens`).
    #[serde(default)]
    pub oauth2_server_uri: Option<String>,
    /// `rest`: OAuth2 scope (default `catalog`).
    #[serde(default)]
    pub scope: Option<String>,
    /// More catalog properties, with Iceberg's names (`header.X-Tenant`, `s3.endpoint`...).
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// `rest`: per principal, a file holding that principal's own bearer token for the
    /// catalog. Set: each principal's `loadTable` is asked with its token, so the read
    /// restrictions the catalog returns are that principal's, and a principal without a
    /// token here is refused the catalog's tables. Empty (default): ClearIce asks with its
    /// own credential, and the restrictions the catalog returns apply to every principal.
    #[serde(default)]
    pub principal_tokens: BTreeMap<String, PathBuf>,
}

/// Catalog kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CatalogKind {
    /// Iceberg SQL catalog (the JDBC catalog schema, as PyIceberg's `SqlCatalog`).
    Sql,
    /// Iceberg REST catalog (the Iceberg REST OpenAPI spec).
    Rest,
    /// Hive Metastore (Thrift): Iceberg tables registered there, read-only.
    Hms,
}

/// `[execution]`: the memory every statement of this process shares (DataFusion's
/// memory pool, as `datafusion-cli --memory-limit --mem-pool-type`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutionConfig {
    /// Memory all running statements may reserve together, in MiB (default: no limit).
    /// Sorts, aggregates and joins spill to disk first; a statement that still cannot get
    /// memory fails with `RESOURCE_EXHAUSTED` naming its largest consumers.
    #[serde(default)]
    pub memory_limit_mb: Option<u64>,
    /// How the pool is shared: `fair` (default: each spilling operator gets an equal
    /// share) or `greedy` (first come, first served).
    #[serde(default)]
    pub memory_pool: MemoryPoolKind,
}

/// `[execution] memory_pool`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemoryPoolKind {
    /// DataFusion's `FairSpillPool`.
    #[default]
    Fair,
    /// DataFusion's `GreedyMemoryPool`.
    Greedy,
}

/// `[storage]`: where tables' files live besides the local disk.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageConfig {
    /// S3-compatible object storage (`s3://` warehouses and files).
    #[serde(default)]
    pub s3: Option<S3Config>,
}

/// `[storage.s3]`. Unset credentials and region come from a catalog's `s3.*`
/// properties, then `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`/`AWS_SESSION_TOKEN`,
/// `AWS_REGION`, `AWS_ENDPOINT_URL_S3`/`AWS_ENDPOINT_URL` and the shared files' profile.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct S3Config {
    /// Endpoint URL (MinIO, a VPC endpoint; `http://` for a loopback server).
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Region (default from the environment, else `us-east-1`).
    #[serde(default)]
    pub region: Option<String>,
    /// Path-style requests (default: on with a custom endpoint, as MinIO needs).
    #[serde(default)]
    pub path_style: Option<bool>,
    /// Access key id (its secret in `secret_access_key_file`).
    #[serde(default)]
    pub access_key_id: Option<String>,
    /// File holding the secret access key.
    #[serde(default)]
    pub secret_access_key_file: Option<PathBuf>,
    /// Shared-files profile (default `AWS_PROFILE`, else `default`).
    #[serde(default)]
    pub profile: Option<String>,
    /// Unsigned requests (public buckets).
    #[serde(default)]
    pub anonymous: bool,
    /// Per-request timeout, seconds (default 60).
    #[serde(default)]
    pub timeout_s: Option<u64>,
    /// Retries of a failed request (default 2).
    #[serde(default)]
    pub retries: Option<usize>,
    /// PEM CA certificate(s) of an endpoint with a private CA.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
}

/// `[providers.NAME]`: a crypto provider (keys stay in a protection service).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// Provider kind; `remote` (the DBPS-style HTTP protocol of `clearice crypto-server`).
    #[serde(rename = "type")]
    pub kind: ProviderKind,
    /// Base URL, e.g. `https://crypto.example.com:8443`.
    pub url: String,
    /// PEM CA bundle of a service with a private CA (then only it is trusted).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// File holding a bearer token to send (when the caller brings none).
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// File holding an HS256 secret: short-lived JWTs are minted per call instead.
    #[serde(default)]
    pub hs256_secret_file: Option<PathBuf>,
    /// `sub` of minted tokens; default `clearice`.
    #[serde(default)]
    pub subject: Option<String>,
    /// `aud` of minted tokens; default `clearice-crypto`.
    #[serde(default)]
    pub audience: Option<String>,
    /// Longest one request may take, seconds; default 10.
    #[serde(default)]
    pub timeout_s: Option<f64>,
    /// Requests in flight at once; default 16.
    #[serde(default)]
    pub max_concurrent: Option<usize>,
    /// Retries of idempotent requests after transient failures; default 2.
    #[serde(default)]
    pub retries: Option<u32>,
    /// Largest module payload per request, MiB; default 8.
    #[serde(default)]
    pub max_request_mb: Option<usize>,
}

/// Provider kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// HTTP/JSON protection service.
    Remote,
}

/// `[policy]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// Policy file (TOML).
    pub path: PathBuf,
}

/// `[audit]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditConfig {
    /// JSON-lines file, appended to.
    pub path: PathBuf,
}

/// `[cluster]`: scale-out on datafusion-distributed workers.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// The workers' URLs (`http://host:port`), for a coordinator.
    #[serde(default)]
    pub workers: Vec<String>,
    /// File holding the secret (at least 32 bytes) coordinator and workers share: every
    /// scan sent to a worker is signed with it (HMAC-SHA256), and a worker refuses scans
    /// it cannot verify.
    pub secret_file: PathBuf,
    /// File groups per worker in a scan (default the session's `target_partitions`).
    #[serde(default)]
    pub partitions_per_worker: Option<usize>,
    /// How long a signed scan stays valid, seconds (default 3600): a worker refuses older
    /// ones (replayed plan bytes).
    #[serde(default)]
    pub task_ttl_s: Option<u64>,
    /// How often a coordinator probes its workers, milliseconds (default 500): a worker
    /// that stops answering gets no new stages after the next probe (a query that meets
    /// it before then is run again on the others).
    #[serde(default)]
    pub probe_interval_ms: Option<u64>,
    /// On a coordinator: the most result bytes of a query held back while it can still
    /// be retried on other workers, MiB (default 16; 0: rows are passed on at once, and a
    /// worker lost after the first row fails the query). Held in the query's memory.
    #[serde(default)]
    pub retry_window_mb: Option<u64>,
    /// On a worker: the most memory one query may reserve on it, MiB (default none: the
    /// query's limit on its coordinator, sent with its stages, applies on each worker).
    /// All the tasks of a query share it, inside the worker's `[execution]` pool.
    #[serde(default)]
    pub query_memory_mb: Option<u64>,
    /// On a worker: the longest a query may run on it, seconds (default 3600); a query
    /// whose coordinator gives it less time (`[server.limits] statement_timeout_s`)
    /// stops on the workers when that runs out.
    #[serde(default)]
    pub query_timeout_s: Option<u64>,
    /// PEM certificate chain of this process in the cluster: a worker's server
    /// certificate (naming the host in its URL), and the client certificate every
    /// process presents to workers. With `tls_key` and `tls_ca`, every channel between
    /// coordinator and workers is mutual TLS and worker URLs are `https://`.
    #[serde(default)]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`.
    #[serde(default)]
    pub tls_key: Option<PathBuf>,
    /// PEM CA bundle of the cluster: the only roots a worker's certificate is checked
    /// against, and the only issuer of client certificates a worker accepts.
    #[serde(default)]
    pub tls_ca: Option<PathBuf>,
    /// Plaintext (no `tls_*`) beyond loopback: a worker may listen on, and a coordinator
    /// may call, a non-loopback address although the traffic (decrypted, masked rows,
    /// call credentials) crosses the network unencrypted.
    #[serde(default)]
    pub insecure: bool,
}

/// `[server]`: the Flight SQL endpoint.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Listen address; `--addr` overrides. Default `127.0.0.1:50051`.
    #[serde(default)]
    pub addr: Option<String>,
    /// Bearer token lifetime in seconds; default 3600.
    #[serde(default)]
    pub token_ttl_s: Option<u64>,
    /// PEM certificate chain for TLS.
    #[serde(default)]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for TLS.
    #[serde(default)]
    pub tls_key: Option<PathBuf>,
    /// PEM CA bundle: when set, clients must present a certificate it signed (mTLS).
    #[serde(default)]
    pub tls_client_ca: Option<PathBuf>,
    /// Allow listening without TLS on a non-loopback address.
    #[serde(default)]
    pub insecure: bool,
    /// Users and their argon2 password hashes (PHC strings), e.g.
    /// `[server.users.ann] password_hash = "$argon2id$v=19$..."`.
    #[serde(default)]
    pub users: BTreeMap<String, ServerUser>,
    /// Failed logins a user name or client address may make before each further attempt
    /// waits (exponential backoff); default 3.
    #[serde(default)]
    pub login_free_failures: Option<u32>,
    /// Longest wait imposed after failed logins, milliseconds; default 30000. The wait
    /// doubles with each failure from 250 ms.
    #[serde(default)]
    pub login_backoff_max_ms: Option<u64>,
    /// Per-principal resource limits of Flight SQL statements.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// The catalog unqualified and two-part names resolve in for Flight SQL sessions;
    /// default the configured catalog when there is exactly one (with several, DataFusion's
    /// in-memory `datafusion`: adding a catalog must not move where names resolve). A
    /// client's `catalog` header or session option overrides it.
    #[serde(default)]
    pub default_catalog: Option<String>,
    /// The schema unqualified names resolve in; default `public`.
    #[serde(default)]
    pub default_schema: Option<String>,
}

impl ServerConfig {
    /// The default catalog and schema of a Flight SQL user: the user's own, else the
    /// server's, else the only one of `catalogs` (and DataFusion's schema).
    pub fn namespace_of<'a>(
        &'a self,
        user: &str,
        mut catalogs: impl Iterator<Item = &'a str>,
    ) -> (Option<&'a str>, Option<&'a str>) {
        let own = self.users.get(user);
        let only = match (catalogs.next(), catalogs.next()) {
            (Some(c), None) => Some(c),
            _ => None,
        };
        let catalog = own
            .and_then(|u| u.default_catalog.as_deref())
            .or(self.default_catalog.as_deref())
            .or(only);
        let schema = own
            .and_then(|u| u.default_schema.as_deref())
            .or(self.default_schema.as_deref());
        (catalog, schema)
    }
}

/// `[shell]`: the local shell (`clearice`, `-c`, `-f`, `slt`).
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ShellConfig {
    /// Confine the shell like a Flight SQL session (no file by path outside the policy's
    /// areas, no DDL/DML, `SET` allow-list, `[server.limits]`). Default false: the local
    /// user owns the machine's files.
    #[serde(default)]
    pub confine: bool,
}

/// A Flight SQL user.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerUser {
    /// argon2 PHC string (never a plaintext password).
    pub password_hash: String,
    /// Marks demo users whose password equals their name (`serve` warns about them).
    #[serde(default)]
    pub demo: bool,
    /// This user's default catalog (overrides `[server] default_catalog`).
    #[serde(default)]
    pub default_catalog: Option<String>,
    /// This user's default schema (overrides `[server] default_schema`).
    #[serde(default)]
    pub default_schema: Option<String>,
}

/// Explicit keys: a JSON object `{"<key id>": "<base64 key>"}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExplicitKeysConfig {
    /// Key file.
    pub path: PathBuf,
}

impl Config {
    /// Reads and validates a config file (blocking: front ends call it once at startup,
    /// before they serve anything).
    #[expect(
        clippy::disallowed_methods,
        reason = "startup, before anything is served"
    )]
    pub fn load(path: &Path) -> Result<Self> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| Error::ConfigRead {
            path: shown.clone(),
            reason: e.to_string(),
        })?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Self::parse(&text, &shown, &base)
    }

    /// Parses config text; `source` names it in messages.
    pub fn parse(text: &str, source: &str, base_dir: &Path) -> Result<Self> {
        let mut c: Config = toml::from_str(text).map_err(|e| Error::ConfigParse {
            path: source.into(),
            message: e
                .to_string()
                .lines()
                .filter(|l| !l.trim().is_empty())
                .collect::<Vec<_>>()
                .join(" "),
        })?;
        c.base_dir = base_dir.to_path_buf();
        c.source = source.into();
        if let Some(k) = &c.kms
            && k.kind == KmsKind::Keyring
            && k.path.is_none()
        {
            return Err(Error::ConfigValue {
                path: source.into(),
                key: "kms.path".into(),
                reason: "a keyring KMS needs `path` (the keyring JSON file)".into(),
            });
        }
        for name in c.providers.keys() {
            if name == "local" {
                return Err(Error::ConfigValue {
                    path: source.into(),
                    key: "providers.local".into(),
                    reason: "'local' is the built-in provider's name".into(),
                });
            }
        }
        for (name, cat) in &c.catalogs {
            let bad = |key: &str, reason: String| Error::ConfigValue {
                path: source.into(),
                key: format!("catalogs.{name}.{key}"),
                reason,
            };
            let uri = &cat.uri;
            let rest_only = [
                ("credential_file", cat.credential_file.is_some()),
                ("token_file", cat.token_file.is_some()),
                ("oauth2_server_uri", cat.oauth2_server_uri.is_some()),
                ("scope", cat.scope.is_some()),
                ("principal_tokens", !cat.principal_tokens.is_empty()),
            ];
            match cat.kind {
                CatalogKind::Sql => {
                    if !(uri.starts_with("sqlite:")
                        || uri.starts_with("postgres://")
                        || uri.starts_with("postgresql://"))
                    {
                        return Err(bad(
                            "uri",
                            format!("'{uri}' is not a sqlite: or postgres:// URI"),
                        ));
                    }
                    match &cat.warehouse {
                        None => {
                            return Err(bad(
                                "warehouse",
                                "an SQL catalog needs `warehouse` (file:///abs/path or s3://bucket/prefix)".into(),
                            ));
                        }
                        Some(w) if !w.contains("://") => {
                            return Err(bad(
                                "warehouse",
                                format!("'{w}' is not a URI (e.g. file:///abs/path)"),
                            ));
                        }
                        Some(_) => {}
                    }
                    if let Some((key, _)) = rest_only.iter().find(|(_, set)| *set) {
                        return Err(bad(key, "only a `rest` catalog takes it".into()));
                    }
                }
                CatalogKind::Rest => {
                    if !(uri.starts_with("http://") || uri.starts_with("https://")) {
                        return Err(bad("uri", format!("'{uri}' is not an http(s):// URL")));
                    }
                    if cat.credential_file.is_some() && cat.token_file.is_some() {
                        return Err(bad(
                            "token_file",
                            "give either credential_file or token_file".into(),
                        ));
                    }
                }
                CatalogKind::Hms => {
                    if uri.contains("://") && !uri.starts_with("thrift://") {
                        return Err(bad(
                            "uri",
                            format!("'{uri}' is not a thrift://host:port address"),
                        ));
                    }
                    if let Some((key, _)) = rest_only.iter().find(|(_, set)| *set) {
                        return Err(bad(key, "only a `rest` catalog takes it".into()));
                    }
                }
            }
            for key in cat.properties.keys() {
                // An Authorization header is a secret too, and would stand for every
                // principal when read restrictions are asked per principal.
                if matches!(
                    key.as_str(),
                    "uri" | "warehouse" | "credential" | "token" | "s3.secret-access-key"
                ) {
                    return Err(bad(
                        &format!("properties.{key}"),
                        "set it with its own key (secrets go in files)".into(),
                    ));
                }
                if key.eq_ignore_ascii_case("header.authorization") {
                    return Err(bad(
                        &format!("properties.{key}"),
                        "give the catalog credential with token_file or credential_file, and principals' own with principal_tokens (secrets go in files)".into(),
                    ));
                }
            }
        }
        if let Some(server) = &c.server {
            let defaults =
                std::iter::once(("server.default_catalog".to_owned(), &server.default_catalog))
                    .chain(server.users.iter().map(|(name, u)| {
                        (
                            format!("server.users.{name}.default_catalog"),
                            &u.default_catalog,
                        )
                    }));
            for (key, catalog) in defaults {
                if let Some(cat) = catalog
                    && cat != crate::SCRATCH_CATALOG
                    && !c.catalogs.contains_key(cat)
                {
                    return Err(Error::ConfigValue {
                        path: source.into(),
                        key,
                        reason: format!(
                            "catalog '{cat}' is not configured (catalogs: {})",
                            c.catalogs
                                .keys()
                                .map(String::as_str)
                                .chain([crate::SCRATCH_CATALOG])
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    });
                }
            }
        }
        if let Some(s3) = &c.storage.s3 {
            if let Some(e) = &s3.endpoint
                && !(e.starts_with("http://") || e.starts_with("https://"))
            {
                return Err(Error::ConfigValue {
                    path: source.into(),
                    key: "storage.s3.endpoint".into(),
                    reason: format!("'{e}' is not an http(s):// URL"),
                });
            }
            if s3.access_key_id.is_some() != s3.secret_access_key_file.is_some() {
                return Err(Error::ConfigValue {
                    path: source.into(),
                    key: "storage.s3.access_key_id".into(),
                    reason: "give access_key_id and secret_access_key_file together".into(),
                });
            }
        }
        Ok(c)
    }

    /// A path from the config, resolved against the config's directory.
    pub fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.base_dir.join(p)
        }
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests may block")]
mod tests {
    use super::*;

    #[test]
    fn unknown_key_is_reported_with_its_line() {
        let e = Config::parse(
            "[kms]\ntype = \"keyring\"\npath = \"k.json\"\nbogus = 1\n",
            "c.toml",
            Path::new("/"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("c.toml") && e.contains("line 4") && e.contains("bogus"),
            "{e}"
        );
    }

    #[test]
    fn secrets_and_per_principal_keys_are_refused_where_they_do_not_belong() {
        let parse = |toml: &str| {
            Config::parse(toml, "c.toml", Path::new("/"))
                .unwrap_err()
                .to_string()
        };
        let e = parse(
            "[catalogs.r]\ntype=\"rest\"\nuri=\"http://c\"\n\
             [catalogs.r.properties]\n\"header.authorization\"=\"Bearer s3cr3t\"\n",
        );
        assert!(
            e.contains("catalogs.r.properties.header.authorization") && !e.contains("s3cr3t"),
            "{e}"
        );
        let e = parse(
            "[catalogs.l]\ntype=\"sql\"\nuri=\"sqlite:c.db\"\nwarehouse=\"file:///w\"\n\
             [catalogs.l.principal_tokens]\nann=\"ann.token\"\n",
        );
        assert!(e.contains("catalogs.l.principal_tokens"), "{e}");
    }

    #[test]
    fn bad_catalog_uri_names_the_key() {
        let e = Config::parse(
            "[catalogs.lake]\ntype=\"sql\"\nuri=\"mysql://x\"\nwarehouse=\"file:///w\"\n",
            "c.toml",
            Path::new("/"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("catalogs.lake.uri"), "{e}");
    }

    #[test]
    fn relative_paths_resolve_against_the_config_dir() {
        let c = Config::parse(
            "[kms]\ntype=\"keyring\"\npath=\"k.json\"\n",
            "c",
            Path::new("/etc/ci"),
        )
        .unwrap();
        let path = c.kms.as_ref().and_then(|k| k.path.as_ref()).unwrap();
        assert_eq!(c.resolve(path), Path::new("/etc/ci/k.json"));
    }
}
