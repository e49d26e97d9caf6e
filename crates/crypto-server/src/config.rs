//! `crypto-server.toml`: listen address, TLS, KMS, JWT verification, users, key rules.
//!
//! ```toml
//! listen = "127.0.0.1:8443"
//! audit = "crypto-audit.jsonl"         # JSON lines: user, key id, column, decision
//! max_request_mb = 64
//!
//! [tls]                                # absent: plain HTTP (loopback only, unless insecure)
//! cert = "server.pem"
//! key = "server.key"
//!
//! [kms]                                # where master keys live
//! type = "keyring"                     # or "aws" (region, endpoint, profile)
//! path = "keyring.json"
//!
//! [auth]                               # bearer JWTs on every call
//! audience = "clearice-crypto"
//! service_secret_file = "service.secret"  # HS256 secret only trusted services hold
//! trusted_services = ["clearice"]      # subjects that may act for access.user_id, when
//!                                      # their token is signed with service_secret_file
//! es256_public_key = "idp-ec.pem"      # identity provider keys (users' own tokens)
//! rs256_public_key = "idp-rsa.pem"
//! hs256_secret_file = "jwt.secret"     # users' HS256 tokens (see below)
//!
//! [users.alice]
//! roles = ["pii_reader"]
//!
//! [keys.pii_key]                       # who may use master key pii_key ("*": anyone)
//! roles = ["pii_reader"]
//! users = ["admin"]
//!
//! [metrics]                            # Prometheus /metrics (clearice_metrics::MetricsConfig)
//! addr = "127.0.0.1:9465"
//! ```
//!
//! Who may name the user is decided by the key that verified the token, not by its
//! subject: an identity provider may issue a user the subject `clearice`, so a token
//! verified by `es256_public_key` or `rs256_public_key` always acts for its own subject.
//! Only a token signed with `service_secret_file` whose subject is in `trusted_services`
//! may name `access.user_id`. Older configs without `service_secret_file` keep working
//! when they have `hs256_secret_file`: it is then the services' secret (as it was
//! documented), so it must be held by the trusted services only, never by an identity
//! provider. `trusted_services` without either secret is refused at startup.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::Error;
pub use clearice_crypto::KmsConfig;

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Listen address; default `127.0.0.1:8443`.
    #[serde(default)]
    pub listen: Option<String>,
    /// JSON-lines audit file (appended).
    #[serde(default)]
    pub audit: Option<PathBuf>,
    /// Largest request body, MiB; default 64.
    #[serde(default)]
    pub max_request_mb: Option<usize>,
    /// Allow plain HTTP on a non-loopback address.
    #[serde(default)]
    pub insecure: bool,
    /// TLS.
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    /// Master keys.
    pub kms: KmsConfig,
    /// Caller authentication.
    pub auth: AuthConfig,
    /// Users' roles.
    #[serde(default)]
    pub users: BTreeMap<String, UserConfig>,
    /// Who may use each master key.
    #[serde(default)]
    pub keys: BTreeMap<String, KeyRule>,
    /// The Prometheus endpoint (`[metrics] addr`, token, TLS).
    #[serde(default)]
    pub metrics: clearice_metrics::MetricsConfig,
    /// Directory of the file (relative paths resolve against it).
    #[serde(skip)]
    pub base_dir: PathBuf,
}

/// `[tls]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
}

/// `[auth]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// Required `aud` claim.
    pub audience: String,
    /// Required `iss` claim, if set.
    #[serde(default)]
    pub issuer: Option<String>,
    /// File holding an HS256 shared secret. With `service_secret_file` it verifies
    /// users' tokens only; without it, it is also the trusted services' secret.
    #[serde(default)]
    pub hs256_secret_file: Option<PathBuf>,
    /// File holding the HS256 secret only the trusted services hold (at least 32 bytes,
    /// different from `hs256_secret_file`): a token signed with it must have a subject
    /// in `trusted_services`, and may name the user.
    #[serde(default)]
    pub service_secret_file: Option<PathBuf>,
    /// PEM public key for RS256 tokens.
    #[serde(default)]
    pub rs256_public_key: Option<PathBuf>,
    /// PEM public key for ES256 tokens.
    #[serde(default)]
    pub es256_public_key: Option<PathBuf>,
    /// Token subjects (services) trusted to name the user in `access.user_id`, when
    /// their token is signed with `service_secret_file` (or, without it,
    /// `hs256_secret_file`); identity-provider tokens never name another user.
    #[serde(default)]
    pub trusted_services: Vec<String>,
    /// Clock skew allowed on `exp`/`nbf`, seconds; default 30.
    #[serde(default)]
    pub leeway_s: Option<u64>,
}

/// `[users.NAME]`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    /// Roles of the user.
    #[serde(default)]
    pub roles: Vec<String>,
}

/// `[keys.ID]`: a key is usable by the listed users and roles (`"*"`: anyone
/// authenticated); keys without a rule are denied to everyone.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct KeyRule {
    /// Users.
    #[serde(default)]
    pub users: Vec<String>,
    /// Roles.
    #[serde(default)]
    pub roles: Vec<String>,
    /// A table key of tables Iceberg encrypts itself: its key encryption keys are wrapped
    /// and unwrapped (`/wrap`, `/unwrap`, which release them) for trusted services acting
    /// for the users and roles above, never for a user's own token; the key does no module
    /// cryptography (`/decrypt`, `/encrypt`, `/keys` refuse it). A key without it is never
    /// released: `/wrap` and `/unwrap` refuse it (the two wrap formats are the same, so
    /// one key must not serve both).
    #[serde(default)]
    pub table_key: bool,
}

impl Config {
    /// Reads the file (blocking: startup).
    #[expect(clippy::disallowed_methods, reason = "startup, before serving")]
    pub fn load(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Config {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        let mut c: Config = toml::from_str(&text).map_err(|e| Error::Config {
            path: path.display().to_string(),
            reason: e
                .to_string()
                .lines()
                .filter(|l| !l.trim().is_empty())
                .collect::<Vec<_>>()
                .join(" "),
        })?;
        c.base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let a = &c.auth;
        let refuse = |reason: &str| {
            Err(Error::Config {
                path: path.display().to_string(),
                reason: reason.into(),
            })
        };
        if a.hs256_secret_file.is_none()
            && a.service_secret_file.is_none()
            && a.rs256_public_key.is_none()
            && a.es256_public_key.is_none()
        {
            return refuse(
                "[auth] needs hs256_secret_file, service_secret_file, rs256_public_key or es256_public_key",
            );
        }
        if !a.trusted_services.is_empty()
            && a.service_secret_file.is_none()
            && a.hs256_secret_file.is_none()
        {
            return refuse(
                "[auth] trusted_services needs service_secret_file: an HS256 secret only those \
                 services hold, to sign their tokens (ClearIce: providers.NAME.hs256_secret_file); \
                 identity-provider tokens may not name another user",
            );
        }
        if a.service_secret_file.is_some() && a.trusted_services.is_empty() {
            return refuse(
                "[auth] service_secret_file needs trusted_services: the subjects of the services holding it",
            );
        }
        Ok(c)
    }

    /// A path from the file, resolved against its directory.
    pub fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.base_dir.join(p)
        }
    }
}
