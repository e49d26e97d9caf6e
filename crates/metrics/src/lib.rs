//! ClearIce's Prometheus metrics: the series every layer records into (statements by
//! principal, kind and outcome; latencies; rows and bytes returned; bytes decrypted;
//! KMS and provider calls; cache lookups; sessions, prepared statements and the memory
//! pool; refused logins; worker tasks; crypto-server requests) and the `/metrics`
//! endpoint `serve`, `worker` and `crypto-server` answer scrapes on.
//!
//! ```text
//!  engine (statements) ─┐
//!  flight (logins)      ├─▶ one registry ─▶ [metrics] addr ─▶ GET /metrics (bearer token
//!  crypto, pme, iceberg ┘   (families.rs)     (endpoint.rs)     off loopback, TLS)
//! ```
//!
//! A leaf crate (below `crypto`): it knows no SQL, no keys and no policy; callers hand it
//! fixed words and authenticated principal names, never values or peer-supplied text.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(unused_crate_dependencies))]
#![deny(missing_docs)]

mod config;
#[cfg(feature = "endpoint")]
mod endpoint;
mod families;
#[cfg(feature = "endpoint")]
pub mod http;

pub use config::MetricsConfig;
#[cfg(feature = "endpoint")]
pub use endpoint::Endpoint;
pub use families::{
    Cache, LoginFailure, MAX_PRINCIPALS, OTHER_PRINCIPAL, Outcome, Running, WorkerCall,
    cache_lookup, crypto_server_request, decrypted, encode, kms_call, login_failed,
    prepared_statements, provider_call, returned, sessions, statement_ended, statement_started,
    watch_memory_pool, worker_call,
};

/// Errors setting up the endpoint.
#[cfg(feature = "endpoint")]
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A `[metrics]` setting is unusable.
    #[error("{key}: {reason}")]
    Config {
        /// The setting (`[metrics] token_file`).
        key: String,
        /// What is wrong.
        reason: String,
    },
}
