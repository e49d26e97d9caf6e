//! Errors of the decrypting reader: one line naming the file, the column and the module.

use clearice_crypto::{ModuleError, ModulePosition, ModuleType, ProviderError};

/// Why a PME file (or part of it) could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecryptError {
    /// A module failed authentication or is cut short: tampered, moved between row
    /// groups, columns or files, wrong key, or wrong AAD prefix.
    #[error(
        "file '{file}'{}: {}: {error}",
        column_part(column),
        module_desc(position)
    )]
    Tampered {
        /// Data file.
        file: String,
        /// Column path (`None` for the footer).
        column: Option<String>,
        /// Module type and ordinals.
        position: ModulePosition,
        /// What failed.
        error: ModuleError,
    },
    /// A plaintext footer's signature does not verify with the footer key.
    #[error(
        "file '{file}': footer signature mismatch (the plaintext footer was modified, or the footer key is wrong)"
    )]
    Signature {
        /// Data file.
        file: String,
    },
    /// The crypto provider refused, failed, or could not resolve a key.
    #[error("file '{file}'{}: {source}", column_part(column))]
    Provider {
        /// Data file.
        file: String,
        /// Column path (`None` for the footer).
        column: Option<String>,
        /// The provider's error.
        #[source]
        source: Box<ProviderError>,
    },
    /// A column this scan may not decrypt was read anyway.
    #[error("file '{file}': column '{column}' is not decrypted in this scan: {reason}")]
    Refused {
        /// Data file.
        file: String,
        /// Column path.
        column: String,
        /// Why its key was not requested or granted.
        reason: String,
    },
    /// The file's AAD prefix is not stored in it and none was supplied.
    #[error(
        "file '{file}' was written with an AAD prefix that is not stored in the file; supply it (option 'format.crypto.file_decryption.aad_prefix_as_hex')"
    )]
    AadPrefixRequired {
        /// Data file.
        file: String,
    },
    /// Not a well-formed (encrypted) Parquet file.
    #[error("file '{file}': {reason}")]
    Malformed {
        /// Data file.
        file: String,
        /// What is wrong.
        reason: String,
    },
}

fn column_part(column: &Option<String>) -> String {
    column
        .as_deref()
        .map(|c| format!(": column '{c}'"))
        .unwrap_or_default()
}

/// `footer`, `data page (row group 0, page 3)`, `offset index (row group 1)`.
pub fn module_desc(p: &ModulePosition) -> String {
    match p.kind {
        ModuleType::Footer => p.kind.to_string(),
        k if k.has_page_ordinal() => {
            format!("{k} (row group {}, page {})", p.row_group, p.page)
        }
        k => format!("{k} (row group {})", p.row_group),
    }
}

impl DecryptError {
    /// A provider error, with `Invalid` turned into [`DecryptError::Tampered`].
    pub fn from_provider(file: &str, column: Option<&str>, e: ProviderError) -> Self {
        match e {
            ProviderError::Invalid {
                position, error, ..
            } => Self::Tampered {
                file: file.into(),
                column: column.map(Into::into),
                position,
                error,
            },
            source => Self::Provider {
                file: file.into(),
                column: column.map(Into::into),
                source: Box::new(source),
            },
        }
    }
}

impl From<DecryptError> for parquet::errors::ParquetError {
    fn from(e: DecryptError) -> Self {
        parquet::errors::ParquetError::External(Box::new(e))
    }
}
