//! Errors of the crypto crate. Variants name key ids and files, never key bytes.

/// Boxed source error.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Errors raised while resolving or unwrapping keys.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The KMS has no master key with this id.
    #[error("KMS '{kms}' has no master key '{key_id}'")]
    UnknownMasterKey {
        /// KMS name.
        kms: String,
        /// Master key id.
        key_id: String,
    },
    /// Unwrapping failed: wrong master key, wrong key id, or tampered wrapped key.
    #[error(
        "KMS '{kms}' failed to unwrap a key under master key '{key_id}': authentication failed (wrong or tampered key)"
    )]
    Unwrap {
        /// KMS name.
        kms: String,
        /// Master key id.
        key_id: String,
    },
    /// Wrapping failed.
    #[error("KMS '{kms}' failed to wrap a key under master key '{key_id}'")]
    Wrap {
        /// KMS name.
        kms: String,
        /// Master key id.
        key_id: String,
    },
    /// The `hmac_sha256` mask's secret file is unusable.
    #[error("mask key file '{path}': {reason}")]
    MaskKey {
        /// File path.
        path: String,
        /// What is wrong (never key bytes).
        reason: String,
    },
    /// A keyring or key file could not be read or parsed.
    #[error("keyring '{path}': {reason}")]
    Keyring {
        /// File path.
        path: String,
        /// What is wrong (never key bytes).
        reason: String,
    },
    /// Key material (PKMT1 JSON) is malformed.
    #[error("malformed key material{}: {reason}", file.as_deref().map(|f| format!(" in '{f}'")).unwrap_or_default())]
    KeyMaterial {
        /// Data file, when known.
        file: Option<String>,
        /// What is wrong.
        reason: String,
    },
    /// The DEK could not be decrypted with its KEK.
    #[error(
        "data key under master key '{key_id}' does not decrypt with its key-encryption key (tampered key material)"
    )]
    DataKey {
        /// Master key id.
        key_id: String,
    },
    /// No explicit key is configured for a key id found in a file.
    #[error(
        "no key for key id '{key_id}' (the file's key metadata is not PME key material and no explicit key has this id)"
    )]
    NoExplicitKey {
        /// The key id from the file's key metadata.
        key_id: String,
    },
    /// The scan did not request this key: the column is not needed, or policy withholds it.
    #[error("key under master key '{key_id}' was not requested for this scan ({reason})")]
    NotRequested {
        /// Master key id.
        key_id: String,
        /// Why.
        reason: String,
    },
    /// A KMS call failed (unreachable, refused, throttled).
    #[error("KMS '{kms}' call{} failed: {reason}", if key_id.is_empty() { String::new() } else { format!(" for master key '{key_id}'") })]
    KmsCall {
        /// KMS name.
        kms: String,
        /// Master key id (empty when not about one key).
        key_id: String,
        /// What failed (never key bytes or credentials).
        reason: String,
    },
    /// A crypto provider is misconfigured.
    #[error("crypto provider '{provider}': {reason}")]
    Provider {
        /// Provider name.
        provider: String,
        /// What is wrong.
        reason: String,
    },
    /// External key material (a side file) could not be read.
    #[error("external key material '{path}': {reason}")]
    ExternalKeyMaterial {
        /// Side file path.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
