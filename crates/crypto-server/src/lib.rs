//! `clearice crypto-server`: the reference protection service for ClearIce's `remote`
//! crypto provider. It holds master keys through its KMS (a keyring file or AWS KMS),
//! authenticates every call by bearer JWT, decides per user (or role) and key, decrypts
//! and encrypts PME modules for permitted callers, and writes its own JSON-lines audit.
//! Key bytes never leave it. The protocol is documented in
//! [`clearice_crypto::protocol`].
//!
//! ```text
//!  caller ──bearer JWT──▶ auth (issuer, audience, expiry; services by their own secret)
//!         ──/access, /decrypt, /encrypt, /keys──▶ rules (user or role × key) ─▶ KMS
//!         ◀── modules decrypted or encrypted here, key material; never key bytes
//!  every call ─▶ the service's JSON-lines audit
//! ```
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(unused_crate_dependencies))]
#![deny(missing_docs)]

mod auth;
pub mod config;
mod server;

pub use auth::{Caller, Verifier};
pub use config::Config;
pub use server::{Service, serve, tls_acceptor};

/// Errors of the service's setup (requests answer with the protocol's error bodies).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The config or a file it names is unusable.
    #[error("crypto-server config '{path}': {reason}")]
    Config {
        /// File.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The KMS could not be set up.
    #[error(transparent)]
    Kms(#[from] clearice_crypto::Error),
    /// Listening or serving failed.
    #[error("crypto-server: {0}")]
    Io(#[from] std::io::Error),
}
