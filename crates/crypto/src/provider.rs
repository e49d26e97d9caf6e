//! The crypto-provider interface: who does the module cryptography of PME files.
//!
//! ClearIce's decrypting reader never decrypts with a key it was not handed: it sends
//! batches of encrypted modules, each with its full context, to a [`CryptoProvider`].
//! The [`LocalProvider`](crate::LocalProvider) does the cryptography in process with keys
//! from the configured KMS (and, through [`CryptoProvider::release_key`], lets the reader
//! decrypt pages itself); a remote provider keeps the keys in a protection service that
//! decides per principal.
//!
//! To add a provider: implement the trait (batch calls, never block the calling task:
//! do KMS and network work asynchronously or on a blocking thread), return
//! [`ProviderError::Denied`] when the service refuses the principal the key, and
//! [`ProviderError::Unavailable`] when it cannot be reached.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;

use crate::error::Error;
use crate::modules::{Algorithm, ModuleError, ModulePosition};
use crate::secret::SecretKey;

/// Who asks and for what: sent with every call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallContext {
    /// The principal the query runs as (REPL user or authenticated Flight user).
    pub principal: String,
    /// The data file (object store path).
    pub file: String,
    /// Application context: `table`, `namespace`, `schema_id`... as known.
    pub application: BTreeMap<String, String>,
    /// The principal's own token for the provider (a Flight client's `key_access_token`),
    /// used instead of the provider's configured credentials.
    pub credential: Option<AccessToken>,
}

/// A bearer token: redacted in `Debug`, zeroed when dropped, no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct AccessToken(zeroize::Zeroizing<String>);

impl AccessToken {
    /// Wraps a token.
    pub fn new(token: impl Into<String>) -> Self {
        Self(zeroize::Zeroizing::new(token.into()))
    }

    /// The token text. Callers must not log or format it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AccessToken(<redacted>)")
    }
}

/// A provider's answer on whether a principal may use a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyAccess {
    /// The principal may use the key.
    Granted,
    /// The provider refuses the principal this key.
    Denied,
    /// The provider does not know the key.
    Unknown,
}

/// A file's key, as named by its key metadata.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct KeyRef {
    /// The key metadata bytes stored in the file (key material or a key id).
    pub key_metadata: Bytes,
    /// Master key id (key-tools material) or explicit key id.
    pub key_id: String,
    /// Whether the key material says this is the file's footer key.
    pub is_footer_key: bool,
    /// Whether `key_id` is a KMS master key id (key-tools material), not an explicit key.
    pub master_key: bool,
}

impl std::fmt::Debug for KeyRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Key metadata holds wrapped keys: name the key, not the material.
        f.debug_struct("KeyRef")
            .field("key_id", &self.key_id)
            .field("is_footer_key", &self.is_footer_key)
            .finish_non_exhaustive()
    }
}

/// Modules under one key of one column (or the footer), decrypted or encrypted in one call.
#[derive(Debug, Clone)]
pub struct ModuleBatch {
    /// The key.
    pub key: KeyRef,
    /// The file's algorithm.
    pub algorithm: Algorithm,
    /// Column path (`a.b.c`), `None` for the footer.
    pub column: Option<String>,
    /// The modules.
    pub modules: Vec<Module>,
}

/// One module with its context.
#[derive(Debug, Clone)]
pub struct Module {
    /// Type and ordinals.
    pub position: ModulePosition,
    /// The module's AAD (prefix, file unique part, type, ordinals).
    pub aad: Vec<u8>,
    /// To decrypt: the module body (`nonce || ciphertext [|| tag]`, no length prefix).
    /// To encrypt: the plaintext.
    pub data: Bytes,
    /// To encrypt with a given nonce (footer signatures); `None` draws a fresh one.
    pub nonce: Option<[u8; crate::modules::NONCE_LEN]>,
}

/// How a provider call failed. Behaviour (column outcome, gRPC code, audit kind) is
/// decided on the variant.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The provider refuses this principal this key.
    #[error("crypto provider '{provider}' denied key '{key_id}' to '{principal}': {reason}")]
    Denied {
        /// Provider name.
        provider: String,
        /// Key id.
        key_id: String,
        /// Principal.
        principal: String,
        /// The provider's reason.
        reason: String,
    },
    /// The provider refused the credentials (wrong, expired or missing token).
    #[error("crypto provider '{provider}' rejected the credentials: {reason}")]
    Unauthenticated {
        /// Provider name.
        provider: String,
        /// The provider's reason.
        reason: String,
    },
    /// The provider cannot be reached or timed out.
    #[error("crypto provider '{provider}' unavailable: {reason}")]
    Unavailable {
        /// Provider name.
        provider: String,
        /// What failed.
        reason: String,
    },
    /// A module did not decrypt: tag mismatch (tampering, wrong key or AAD) or truncation.
    #[error("{} {} failed: {error}", position.kind, ordinals(position))]
    Invalid {
        /// Index of the module in the batch.
        index: usize,
        /// Its position.
        position: ModulePosition,
        /// Why.
        error: ModuleError,
    },
    /// The key could not be resolved (KMS, key material, scope).
    #[error(transparent)]
    Key(#[from] Error),
}

fn ordinals(p: &ModulePosition) -> String {
    use crate::modules::ModuleType;
    match p.kind {
        ModuleType::Footer => String::new(),
        k if k.has_page_ordinal() => {
            format!("(row group {}, page {})", p.row_group, p.page)
        }
        _ => format!("(row group {})", p.row_group),
    }
}

/// Does the module cryptography of PME files for the reader (and writer).
#[async_trait::async_trait]
pub trait CryptoProvider: Send + Sync + std::fmt::Debug {
    /// Name for errors and the audit log.
    fn name(&self) -> &str;

    /// What the key metadata names (master key id), without requesting the key.
    async fn describe_key(
        &self,
        ctx: &CallContext,
        key_metadata: Bytes,
    ) -> Result<KeyRef, ProviderError>;

    /// Decrypts every module of the batch; the result has one plaintext per module
    /// (`Bytes`, so a provider answering over the network hands out slices of its
    /// answer instead of copies).
    async fn decrypt(
        &self,
        ctx: &CallContext,
        batch: ModuleBatch,
    ) -> Result<Vec<Bytes>, ProviderError>;

    /// Encrypts every module of the batch; the result has one body per module
    /// (`nonce || ciphertext [|| tag]`, no length prefix).
    async fn encrypt(
        &self,
        ctx: &CallContext,
        batch: ModuleBatch,
    ) -> Result<Vec<Vec<u8>>, ProviderError>;

    /// Whether `ctx`'s principal may use each master key id, asked before a scan so a
    /// denied column gets its `on_missing_key` outcome instead of failing mid-stream.
    /// The default grants every key (the provider decides nothing per principal).
    async fn check_access(
        &self,
        _ctx: &CallContext,
        key_ids: &[String],
    ) -> Result<BTreeMap<String, KeyAccess>, ProviderError> {
        Ok(key_ids
            .iter()
            .map(|k| (k.clone(), KeyAccess::Granted))
            .collect())
    }

    /// A new data key under `master_key_id` for a file being written: its key metadata
    /// (PKMT1 key material the provider can resolve again), and the key itself only if
    /// the provider releases keys. A provider that keeps its keys returns `key: None` and
    /// encrypts the file's modules itself ([`Self::encrypt`]).
    async fn new_data_key(
        &self,
        _ctx: &CallContext,
        master_key_id: &str,
        _is_footer_key: bool,
    ) -> Result<NewDataKey, ProviderError> {
        Err(ProviderError::Unavailable {
            provider: self.name().to_owned(),
            reason: format!("does not create data keys (master key '{master_key_id}')"),
        })
    }

    /// Wraps `key` (a key encryption key of a table Iceberg encrypts itself) under the
    /// table key `wrapping_key_id` the provider keeps: Iceberg's
    /// `KeyManagementClient.wrapKey`, decided for `ctx`'s principal. The default refuses
    /// (the provider keeps no table keys).
    async fn wrap_key(
        &self,
        _ctx: &CallContext,
        _key: &[u8],
        wrapping_key_id: &str,
    ) -> Result<Vec<u8>, ProviderError> {
        Err(self.keeps_no_table_keys(wrapping_key_id))
    }

    /// Unwraps a key encryption key wrapped under the table key `wrapping_key_id` the
    /// provider keeps: Iceberg's `KeyManagementClient.unwrapKey`, decided for `ctx`'s
    /// principal ([`ProviderError::Denied`] when it may not use the table key). The table
    /// key never leaves the provider; the key encryption key does (Iceberg's manifests and
    /// file keys are decrypted with it in process). The default refuses.
    async fn unwrap_key(
        &self,
        _ctx: &CallContext,
        _wrapped: &[u8],
        wrapping_key_id: &str,
    ) -> Result<SecretKey, ProviderError> {
        Err(self.keeps_no_table_keys(wrapping_key_id))
    }

    /// The refusal of [`Self::wrap_key`] and [`Self::unwrap_key`] by a provider that keeps
    /// no table keys.
    fn keeps_no_table_keys(&self, wrapping_key_id: &str) -> ProviderError {
        ProviderError::Unavailable {
            provider: self.name().to_owned(),
            reason: format!(
                "does not keep table keys of tables Iceberg encrypts (table key '{wrapping_key_id}')"
            ),
        }
    }

    /// The data key itself, for providers that may hand it out (the reader then decrypts
    /// pages in process). `Ok(None)`: the provider keeps its keys; use [`Self::decrypt`].
    async fn release_key(
        &self,
        _ctx: &CallContext,
        _key: &KeyRef,
    ) -> Result<Option<SecretKey>, ProviderError> {
        Ok(None)
    }
}

/// A data key created for writing.
#[derive(Debug)]
pub struct NewDataKey {
    /// Key metadata to store in the file.
    pub key_metadata: Bytes,
    /// The key, when the provider releases keys.
    pub key: Option<SecretKey>,
}

/// A shared provider.
pub type ProviderRef = Arc<dyn CryptoProvider>;
