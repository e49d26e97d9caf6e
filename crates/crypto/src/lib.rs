//! Parquet Modular Encryption (PME) keys and cryptography: the [`CryptoProvider`]
//! interface and its [`LocalProvider`], module ciphers and AADs ([`modules`]), KMS
//! clients, PME key material
//! (PKMT1, double wrapping, internal and external storage) and a cached
//! [`KeyResolver`] that turns a file's key metadata into data keys (KMS calls are
//! asynchronous, behind a KEK cache).
//!
//! ```text
//!  ScanGrant (what a scan may decrypt, as whom) ─▶ CryptoProvider (LocalProvider,
//!    RemoteProvider, RoutedProvider by key) ─▶ describe_key / release_key / decrypt
//!  LocalProvider ─▶ FileKeyRetriever (per file: scope check, DEK cache, side file)
//!    ─▶ KeyResolver (KEK cache) ─▶ Kms (keyring, AWS KMS; async) ─▶ SecretKey
//!  writers ─▶ KeyMaterialWriter (fresh DEKs, PKMT1 material, one KEK per master key)
//! ```
//!
//! This crate sits below the table and engine crates and has no DataFusion
//! dependency: it is the audit surface for key handling. Keys are [`SecretKey`]s:
//! zeroed on drop and redacted in `Debug`.
//!
//! ```
//! use clearice_crypto::{KeyringKms, Kms};
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let kms = KeyringKms::from_json(r#"{"k":"MDEyMzQ1Njc4OTAxMjM0NQ=="}"#).unwrap();
//! let wrapped = kms.wrap_key(b"0123456789abcdef", "k").await.unwrap();
//! assert_eq!(kms.unwrap_key(&wrapped, "k").await.unwrap().expose(), b"0123456789abcdef");
//! # }
//! ```
//! [`SecretKey`] has no `Display`, so it cannot reach a log line:
//! ```compile_fail
//! let key = clearice_crypto::SecretKey::from_bytes(vec![0; 16]);
//! println!("{key}");
//! ```
#![forbid(unsafe_code)]
// Dependencies nothing uses fail the build (tests add dev-dependencies, so not there).
#![cfg_attr(not(test), deny(unused_crate_dependencies))]
#![deny(missing_docs)]

pub mod aes;
mod aws;
mod error;
mod grant;
mod key_material;
mod kms;
mod local;
mod mask_key;
pub mod modules;
pub mod protocol;
mod provider;
mod remote;
mod resolver;
mod rotate;
mod router;
mod secret;
mod writer;

pub use aws::{AwsEnvironment, AwsKms, AwsKmsConfig};
pub use error::{BoxError, Error, Result};
pub use grant::{ProviderRoute, ScanGrant};
pub use key_material::{KeyMaterial, side_file_name};
pub use kms::{KeyringKms, Kms, KmsConfig, KmsKind};
pub use local::LocalProvider;
pub use mask_key::MaskKey;
pub use modules::{Algorithm, ModuleCipher, ModuleError, ModulePosition, ModuleType};
pub use provider::{
    AccessToken, CallContext, CryptoProvider, KeyAccess, KeyRef, Module, ModuleBatch, NewDataKey,
    ProviderError, ProviderRef,
};
pub use remote::{RemoteConfig, RemoteCredential, RemoteProvider, mint_hs256};
pub use resolver::{
    ColumnKeys, DEFAULT_KEY_CACHE_TTL, FileKeyRetriever, KeyInfo, KeyResolver, KeyScope,
    RetrieverCache, SideFileReader,
};
pub use rotate::rotate_side_file;
pub use router::{LOCAL, Providers, RoutedProvider};
pub use secret::SecretKey;
pub use writer::KeyMaterialWriter;
