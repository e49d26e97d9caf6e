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
//! hs256_secret_file = "jwt.secret"     # shared secret (services)
//! es256_public_key = "idp-ec.pem"      # identity provider keys (users' own tokens)
//! rs256_public_key = "idp-rsa.pem"
//! trusted_services = ["clearice"]      # subjects that may act for access.user_id
//!
//! [users.alice]
//! roles = ["pii_reader"]
//!
//! [keys.pii_key]                       # who may use master key pii_key ("*": anyone)
//! roles = ["pii_reader"]
//! users = ["admin"]
//! ```

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
    /// File holding the HS256 shared secret.
    #[serde(default)]
    pub hs256_secret_file: Option<PathBuf>,
    /// PEM public key for RS256 tokens.
    #[serde(default)]
    pub rs256_public_key: Option<PathBuf>,
    /// PEM public key for ES256 tokens.
    #[serde(default)]
    pub es256_public_key: Option<PathBuf>,
    /// Token subjects (services) trusted to name the user in `access.user_id`.
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
        if c.auth.hs256_secret_file.is_none()
            && c.auth.rs256_public_key.is_none()
            && c.auth.es256_public_key.is_none()
        {
            return Err(Error::Config {
                path: path.display().to_string(),
                reason: "[auth] needs hs256_secret_file, rs256_public_key or es256_public_key"
                    .into(),
            });
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
