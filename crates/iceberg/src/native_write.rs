//! Writes to tables Iceberg encrypts itself, as Iceberg Java writes them (data files
//! here; manifests, manifest list and keys in `commit::commit_overwrite`):
//!
//! ```text
//!  each data file: a fresh data key and AAD prefix from the table's EncryptionManager
//!    ─▶ uniform PME (every module under that key, footer encrypted, prefix not stored)
//!    ─▶ DataFile.key_metadata = StandardKeyMetadata {key, aad prefix}
//!  the parent's manifests (kept, with their key metadata) + one new manifest (AGS1,
//!    its own key in the manifest list entry)
//!  ─▶ manifest list (AGS1, v3 row lineage) whose key metadata is wrapped by the table's
//!     key encryption key (a new one wrapped by the KMS's table key if none is active)
//!     ─▶ `encryption-keys` entries, the snapshot's `key-id`
//!  ─▶ new metadata file ─▶ catalog swap (SQL catalogs; compare-and-set)
//! ```
//!
//! Appends, overwrites and row-level writes (which also rewrite the manifests listing
//! the files they remove, each under a new key) commit the same way.

use std::sync::Arc;

use iceberg::io::FileIO;
use iceberg::table::Table;
use parquet::encryption::encrypt::FileEncryptionProperties;

use crate::error::{Error, Result};

/// One data file's encryption: parquet-rs's properties and the manifest entry's
/// `key_metadata`.
pub(crate) struct FileEncryption {
    pub(crate) properties: Arc<FileEncryptionProperties>,
    pub(crate) key_metadata: Vec<u8>,
}

/// A fresh key and AAD prefix for one data file of `table` at `uri` (the table's data key
/// length), as Iceberg Java's `Parquet.write(NativeEncryptionOutputFile)` uses them.
pub(crate) fn file_encryption(table: &Table, name: &str, uri: &str) -> Result<FileEncryption> {
    let em = encryption_manager(table, name)?;
    let ierr = |source: iceberg::Error| Error::Iceberg {
        table: name.to_owned(),
        source: Box::new(source),
    };
    let output = table.file_io().new_output(uri).map_err(ierr)?;
    let key = em.encrypt(output).key_metadata().clone();
    let prefix = key.aad_prefix().unwrap_or_default().to_vec();
    let properties = FileEncryptionProperties::builder(key.encryption_key().as_bytes().to_vec())
        .with_aad_prefix(prefix)
        .with_aad_prefix_storage(false)
        .build()
        .map_err(|e| Error::Write {
            table: name.to_owned(),
            reason: format!("'{uri}': {e}"),
        })?;
    Ok(FileEncryption {
        properties,
        key_metadata: key.encode().map_err(ierr)?.to_vec(),
    })
}

pub(crate) fn encryption_manager<'a>(
    table: &'a Table,
    name: &str,
) -> Result<&'a iceberg::encryption::EncryptionManager> {
    table
        .encryption_manager()
        .ok_or_else(|| Error::Unsupported {
            table: name.to_owned(),
            what: "writing a table Iceberg encrypts itself without a KMS for its table key ([kms])"
                .into(),
        })
}

/// The size of the file at `path` as stored.
pub(crate) async fn stored_length(io: &FileIO, path: &str) -> iceberg::Result<u64> {
    Ok(io.new_input(path)?.metadata().await?.size)
}
