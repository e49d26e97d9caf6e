//! Errors of the table crate.

use datafusion::error::DataFusionError;

/// Errors raised while resolving and scanning Iceberg tables.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
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
    /// The table's snapshot has delete files, which the scan does not apply yet.
    #[error(
        "table '{table}': snapshot {snapshot_id} has delete files ({file}); reading tables with row-level deletes is not supported yet"
    )]
    DeletesNotSupported {
        /// Table.
        table: String,
        /// Snapshot id.
        snapshot_id: i64,
        /// First delete file.
        file: String,
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
