//! Errors of the engine crate.

/// Errors raised while loading configuration and building sessions.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The config file could not be read.
    #[error("config '{path}': {reason}")]
    ConfigRead {
        /// Path.
        path: String,
        /// Why.
        reason: String,
    },
    /// The config file is malformed (the message has line and column).
    #[error("config '{path}': {message}")]
    ConfigParse {
        /// Path.
        path: String,
        /// toml's message with the line.
        message: String,
    },
    /// A config value is invalid.
    #[error("config '{path}': {key}: {reason}")]
    ConfigValue {
        /// Path.
        path: String,
        /// Dotted key.
        key: String,
        /// Why.
        reason: String,
    },
    /// `demo init` failed.
    #[error("demo lake '{dir}': {reason}")]
    DemoInit {
        /// Target directory.
        dir: String,
        /// Why.
        reason: String,
    },
    /// The policy is invalid.
    #[error(transparent)]
    Policy(#[from] clearice_policy::Error),
    /// The audit log cannot be opened.
    #[error(transparent)]
    Audit(#[from] crate::audit::AuditError),
    /// Key setup failed.
    #[error(transparent)]
    Crypto(#[from] clearice_crypto::Error),
    /// A catalog failed.
    #[error(transparent)]
    Table(#[from] clearice_table::Error),
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The first cause of type `T` in an engine error: the error itself, its sources, and what
/// DataFusion's `External` wraps (ClearIce's own errors travel there). How callers decide
/// behaviour by error type (gRPC code, audit action) instead of by message.
pub fn cause_of<T: std::error::Error + 'static>(
    e: &datafusion::error::DataFusionError,
) -> Option<&T> {
    use datafusion::error::DataFusionError;
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(t) = err.downcast_ref::<T>() {
            return Some(t);
        }
        if let Some(DataFusionError::External(inner)) = err.downcast_ref::<DataFusionError>()
            && let Some(t) = inner.downcast_ref::<T>()
        {
            return Some(t);
        }
        cur = err.source();
    }
    None
}
