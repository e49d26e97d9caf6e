//! Errors of the table crate.

use datafusion::error::DataFusionError;

/// Errors raised while resolving and scanning Iceberg tables.
// Not non_exhaustive: Flight matches every variant, so a new one forces a gRPC code.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The principal is not a user of the policy: every table is denied.
    #[error(
        "access to table '{table}' denied: principal '{principal}' is not a user in policy '{policy}'"
    )]
    UnknownPrincipal {
        /// Table.
        table: String,
        /// Principal.
        principal: String,
        /// Policy source.
        policy: String,
    },
    /// A table rule (`deny`) refuses every scan of the table.
    #[error("access denied: table '{table}' is denied to principal '{principal}' (rule: {rule})")]
    TableDenied {
        /// Table.
        table: String,
        /// Principal.
        principal: String,
        /// The deciding rule.
        rule: String,
    },
    /// A column rule (`deny`) refuses any query naming the column.
    #[error(
        "access denied: column '{column}' of table '{table}' is denied to principal '{principal}' (rule: {rule})"
    )]
    ColumnDenied {
        /// Table.
        table: String,
        /// Column.
        column: String,
        /// Principal.
        principal: String,
        /// The deciding rule.
        rule: String,
    },
    /// A crypto provider could not decide on the table's keys (unreachable, credentials
    /// rejected).
    #[error("table '{table}': {source}")]
    Provider {
        /// Table.
        table: String,
        /// Cause.
        #[source]
        source: Box<clearice_crypto::ProviderError>,
    },
    /// A REST catalog's read restrictions for a table could not be asked for (the
    /// catalog unreachable, an answer that is not a `loadTable` result): the table is not
    /// read.
    #[error("catalog '{catalog}': read restrictions of table '{table}' unavailable: {reason}")]
    CatalogRestrictions {
        /// Catalog name.
        catalog: String,
        /// Table.
        table: String,
        /// What failed (no token, no values).
        reason: String,
    },
    /// The catalog could not be opened.
    #[error("catalog '{catalog}' ({uri}) cannot be opened: {source}")]
    CatalogOpen {
        /// Catalog name.
        catalog: String,
        /// Catalog URI, without credentials.
        uri: String,
        /// Cause.
        #[source]
        source: Box<iceberg::Error>,
    },
    /// An Iceberg operation on a table failed.
    #[error("table '{table}': {source}")]
    Iceberg {
        /// Fully qualified table name.
        table: String,
        /// Cause.
        #[source]
        source: Box<iceberg::Error>,
    },
    /// A delete file could not be read or applied.
    #[error("table '{table}': delete file '{file}': {reason}")]
    DeleteFile {
        /// Table.
        table: String,
        /// The delete file.
        file: String,
        /// Why.
        reason: String,
    },
    /// A file Iceberg encrypts (manifest list, manifest, deletion vector) does not decrypt
    /// under its key: tampered, truncated, or written under another key.
    #[error(
        "table '{table}': {kind} '{file}' does not decrypt under its key (tampered, or written under another key)"
    )]
    Tampered {
        /// Table.
        table: String,
        /// `manifest list`, `manifest`, `deletion vector`.
        kind: String,
        /// The file.
        file: String,
    },
    /// A table Iceberg encrypts whose metadata file its catalog does not vouch for
    /// (swapped, renamed, re-keyed): not read.
    #[error("table '{table}': {reason}")]
    Untrusted {
        /// Table.
        table: String,
        /// What does not hold.
        reason: String,
    },
    /// Time travel to a snapshot, timestamp or ref the table does not have.
    #[error("table '{table}': {reason}")]
    SnapshotNotFound {
        /// Table.
        table: String,
        /// What was asked and what the table has.
        reason: String,
    },
    /// A write ClearIce cannot run exactly (a correlated subquery in its condition, a
    /// LIMIT...): refused before any change.
    #[error("{statement} on '{table}' refused before any change: {reason}")]
    NotExact {
        /// Table.
        table: String,
        /// DELETE, UPDATE, MERGE.
        statement: String,
        /// What it cannot run exactly, and what to write instead.
        reason: String,
    },
    /// A table feature ClearIce does not read yet.
    #[error("table '{table}': {what} is not supported yet")]
    Unsupported {
        /// Table.
        table: String,
        /// The feature.
        what: String,
    },
    /// The object store of a table's files could not be set up (credentials, endpoint).
    #[error("table '{table}': {source}")]
    Storage {
        /// Table.
        table: String,
        /// The cause.
        source: Box<clearice_storage::StorageError>,
    },
    /// A data file location uses a storage scheme ClearIce cannot read yet.
    #[error("table '{table}': data file '{location}' is on an unsupported storage ({reason})")]
    UnsupportedLocation {
        /// Table.
        table: String,
        /// The location.
        location: String,
        /// Why.
        reason: String,
    },
    /// The policy does not let the principal write what the statement writes (checked
    /// before any file is written).
    #[error("write denied: {what} (principal '{principal}'; {rule})")]
    WriteDenied {
        /// What was refused, naming the table and column.
        what: String,
        /// Principal.
        principal: String,
        /// Which policy setting decides.
        rule: String,
    },
    /// A write statement that cannot run as written (types, NULLs in required columns,
    /// partition transforms, a table that exists or does not).
    #[error("table '{table}': {reason}")]
    InvalidWrite {
        /// Table.
        table: String,
        /// Why.
        reason: String,
    },
    /// Writing data failed.
    #[error("table '{table}': write failed: {reason}")]
    Write {
        /// Table.
        table: String,
        /// Why.
        reason: String,
    },
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for DataFusionError {
    fn from(e: Error) -> Self {
        DataFusionError::External(Box::new(e))
    }
}
