//! Policy errors: each names the file, line and what is wrong.

/// A policy that cannot be loaded or does not fit the catalog.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Malformed or invalid policy text.
    #[error("policy '{source_name}'{}: {message}", line.map(|l| format!(" line {l}")).unwrap_or_default())]
    Invalid {
        /// File name.
        source_name: String,
        /// 1-based line, when known.
        line: Option<usize>,
        /// What is wrong.
        message: String,
    },
    /// The policy names a table or column the catalog does not have, or a mask that does
    /// not apply to the column's type (`clearice policy check`).
    #[error("policy '{source_name}': {message}")]
    Catalog {
        /// File name.
        source_name: String,
        /// What is wrong.
        message: String,
    },
    /// A Ranger export that cannot be imported (`clearice policy import-ranger`): malformed,
    /// or a restriction ClearIce cannot express, naming the Ranger policy.
    #[error("Ranger export '{source_name}': {message}")]
    RangerExport {
        /// File name.
        source_name: String,
        /// What is wrong.
        message: String,
    },
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
