//! `[metrics]` of a config file (`clearice.toml`, `crypto-server.toml`): where the
//! endpoint listens, its token and TLS. Parsed by every config; served with the
//! `endpoint` feature.

use std::path::PathBuf;

use serde::Deserialize;

/// The `[metrics]` section of a config file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Listen address of `/metrics` (`host:port`); absent: no endpoint.
    #[serde(default)]
    pub addr: Option<String>,
    /// File holding the bearer token a scrape must send.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// TLS certificate chain (PEM).
    #[serde(default)]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[serde(default)]
    pub tls_key: Option<PathBuf>,
    /// Allow plaintext on a non-loopback address.
    #[serde(default)]
    pub insecure: bool,
}
