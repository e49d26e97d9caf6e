//! Errors of the engine crate.

use clearice_access::cause_of;

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
    /// `demo init` failed (`clearice_demo::init_with`).
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
    Table(#[from] clearice_iceberg::Error),
    /// The cluster worker service failed.
    #[error("cluster worker: {0}")]
    Worker(String),
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub use clearice_access::ErrorClass;

/// Classifies an engine error (see [`ErrorClass`]).
pub fn classify(e: &datafusion::error::DataFusionError) -> ErrorClass {
    use clearice_access::confine::Refusal;
    use clearice_access::limits::LimitExceeded;
    use clearice_iceberg::Error as TableError;
    use clearice_pme::DecryptError;
    use datafusion::error::DataFusionError;
    if let Some(r) = cause_of::<Refusal>(e) {
        return match r {
            Refusal::FileRead { .. }
            | Refusal::FileWrite { .. }
            | Refusal::Setting { .. }
            | Refusal::Statement { .. } => ErrorClass::Denied,
        };
    }
    if let Some(t) = cause_of::<TableError>(e) {
        return match t {
            TableError::UnknownPrincipal { .. }
            | TableError::TableDenied { .. }
            | TableError::ColumnDenied { .. }
            | TableError::WriteDenied { .. } => ErrorClass::Denied,
            TableError::InvalidWrite { .. } => ErrorClass::InvalidQuery,
            TableError::CatalogOpen { .. }
            | TableError::CatalogRestrictions { .. }
            | TableError::Iceberg { .. }
            | TableError::Storage { .. } => ErrorClass::Unavailable,
            TableError::Provider { source, .. } => provider_class(source),
            TableError::Unsupported { .. } | TableError::NotExact { .. } => ErrorClass::Unsupported,
            TableError::SnapshotNotFound { .. } => ErrorClass::NotFound,
            TableError::DeleteFile { .. } => ErrorClass::DataUnusable,
            TableError::Tampered { .. } | TableError::Untrusted { .. } => ErrorClass::Tampered,
            TableError::UnsupportedLocation { .. } | TableError::Write { .. } => {
                ErrorClass::DataUnusable
            }
        };
    }
    if let Some(u) = cause_of::<clearice_access::confine::UnreadableUrl>(e) {
        return if u.missing {
            ErrorClass::NotFound
        } else {
            ErrorClass::Unavailable
        };
    }
    if let Some(l) = cause_of::<LimitExceeded>(e) {
        return match l {
            LimitExceeded::Timeout { .. } => ErrorClass::Timeout,
            LimitExceeded::Concurrency { .. }
            | LimitExceeded::Rows { .. }
            | LimitExceeded::Bytes { .. } => ErrorClass::ResourceLimit,
        };
    }
    if let Some(c) = cause_of::<clearice_cluster::ClusterError>(e) {
        use clearice_cluster::ClusterError as C;
        return match c {
            C::Refused { .. } => ErrorClass::Denied,
            C::OnWorker { class, .. } => *class,
            C::WorkerLost { .. } | C::WorkerFailed { .. } | C::NoWorkers { .. } => {
                ErrorClass::Unavailable
            }
        };
    }
    if let Some(d) = cause_of::<DecryptError>(e) {
        return match d {
            DecryptError::Tampered { .. } | DecryptError::Signature { .. } => ErrorClass::Tampered,
            DecryptError::Refused { .. } => ErrorClass::Denied,
            DecryptError::Provider { source, .. } => provider_class(source),
            _ => ErrorClass::DataUnusable,
        };
    }
    match e {
        DataFusionError::Plan(m) if m.contains("not found") => ErrorClass::NotFound,
        DataFusionError::SQL(..)
        | DataFusionError::Plan(_)
        | DataFusionError::SchemaError(..)
        | DataFusionError::Configuration(_) => ErrorClass::InvalidQuery,
        DataFusionError::NotImplemented(_) => ErrorClass::Unsupported,
        DataFusionError::ResourcesExhausted(_) => ErrorClass::ResourceLimit,
        DataFusionError::ExecutionJoin(_) => ErrorClass::Cancelled,
        DataFusionError::Diagnostic(_, inner) | DataFusionError::Context(_, inner) => {
            classify(inner)
        }
        // An error kept in an operator's shared state (a hash join's build side).
        DataFusionError::Shared(inner) => classify(inner),
        // Files, keys, object stores: the data or its keys are not usable right now.
        DataFusionError::ParquetError(_)
        | DataFusionError::ObjectStore(_)
        | DataFusionError::IoError(_)
        | DataFusionError::External(_)
        | DataFusionError::ArrowError(..)
        | DataFusionError::Execution(_) => ErrorClass::DataUnusable,
        DataFusionError::Substrait(_) | DataFusionError::Internal(_) | DataFusionError::Ffi(_) => {
            ErrorClass::Internal
        }
        DataFusionError::Collection(errs) => errs.first().map_or(ErrorClass::Internal, classify),
    }
}

/// The class of a crypto provider's failure.
fn provider_class(e: &clearice_crypto::ProviderError) -> ErrorClass {
    use clearice_crypto::{Error as KeyError, ProviderError};
    match e {
        ProviderError::Denied { .. }
        | ProviderError::Unauthenticated { .. }
        | ProviderError::Key(KeyError::NotRequested { .. }) => ErrorClass::Denied,
        ProviderError::Unavailable { .. } | ProviderError::Key(KeyError::KmsCall { .. }) => {
            ErrorClass::Unavailable
        }
        ProviderError::Invalid { .. } => ErrorClass::Tampered,
        ProviderError::Key(_) => ErrorClass::DataUnusable,
    }
}

/// The message of an engine error as a front end shows it, on one line: a typed ClearIce
/// error's own message (without DataFusion's `External error:` wrapping), else the
/// error's text.
pub fn message_of(e: &datafusion::error::DataFusionError) -> String {
    use clearice_access::confine::Refusal;
    use clearice_access::limits::LimitExceeded;
    use clearice_iceberg::Error as TableError;
    use clearice_pme::DecryptError;
    let text = if let Some(r) = cause_of::<Refusal>(e) {
        r.to_string()
    } else if let Some(t) = cause_of::<TableError>(e) {
        t.to_string()
    } else if let Some(l) = cause_of::<LimitExceeded>(e) {
        l.to_string()
    } else if let Some(d) = cause_of::<DecryptError>(e) {
        d.to_string()
    } else if let Some(c) = cause_of::<clearice_cluster::ClusterError>(e) {
        c.to_string()
    } else {
        e.to_string()
    };
    clearice_access::one_line(&text)
}
