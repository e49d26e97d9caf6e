//! Appends to tables Iceberg encrypts itself, as Iceberg Java writes them:
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

use std::collections::HashMap;
use std::sync::Arc;

use iceberg::TableUpdate;
use iceberg::encryption::StandardKeyMetadata;
use iceberg::io::FileIO;
use iceberg::spec::{
    DataFile, FormatVersion, ManifestFile, ManifestListWriter, ManifestWriterBuilder, Operation,
    Snapshot, TableMetadata,
};
use iceberg::table::Table;
use parquet::encryption::encrypt::FileEncryptionProperties;

use crate::commit::Committer;
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

fn encryption_manager<'a>(
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

/// Appends `added` (data files of this table written by `FileWriter`, each under its own key) to `table` in one snapshot, through
/// `committer`. Fails, committing nothing and removing the metadata files it wrote, if the
/// table changed since it was loaded. Returns the new metadata.
pub async fn commit_append(
    committer: &Committer,
    name: &str,
    table: &Table,
    added: Vec<DataFile>,
    properties: HashMap<String, String>,
) -> Result<TableMetadata> {
    let ierr = |source: iceberg::Error| Error::Iceberg {
        table: name.to_owned(),
        source: Box::new(source),
    };
    let em = encryption_manager(table, name)?;
    let m = table.metadata();
    if m.format_version() < FormatVersion::V3 {
        return Err(Error::Unsupported {
            table: name.to_owned(),
            what: "Iceberg table encryption below format version 3".into(),
        });
    }
    let parent = m.current_snapshot().cloned();
    let snapshot_id = crate::commit::new_snapshot_id(m);
    let seq = m.next_sequence_number();
    let first_row_id = m.next_row_id();
    let location = m.location().trim_end_matches('/').to_owned();
    let commit = crate::commit::uuid_like();
    let io = table.file_io();
    let mut written: Vec<String> = Vec::new();
    let swapped = std::sync::atomic::AtomicBool::new(false);
    let result = async {
        let mut manifests: Vec<ManifestFile> = Vec::new();
        let (added_files, added_rows, added_size) = (
            added.len() as u64,
            added.iter().map(DataFile::record_count).sum::<u64>(),
            added.iter().map(DataFile::file_size_in_bytes).sum::<u64>(),
        );
        if !added.is_empty() {
            let path = format!("{location}/metadata/{commit}-m0.avro");
            let output = em.encrypt(io.new_output(&path).map_err(ierr)?);
            let mut w = ManifestWriterBuilder::new_from_encrypted(
                output,
                Some(snapshot_id),
                Arc::clone(m.current_schema()),
                m.default_partition_spec().as_ref().clone(),
            )
            .map_err(ierr)?
            .build_v3_data();
            for f in added {
                w.add_file(f, seq).map_err(ierr)?;
            }
            written.push(path.clone());
            let mut manifest = w.write_manifest_file().await.map_err(ierr)?;
            // As Iceberg Java records an AES-GCM stream: its stored length, in the entry and
            // in its key metadata (readers refuse a stream without it: truncation).
            let stored = stored_length(io, &path).await.map_err(ierr)?;
            manifest.manifest_length = stored as i64;
            if let Some(k) = &manifest.key_metadata {
                let k = StandardKeyMetadata::decode(k)
                    .map_err(ierr)?
                    .with_file_length(stored);
                manifest.key_metadata = Some(k.encode().map_err(ierr)?.to_vec());
            }
            manifests.push(manifest);
        }
        if let Some(parent) = &parent {
            let list = table
                .manifest_list_reader(parent)
                .load()
                .await
                .map_err(ierr)?;
            manifests.extend(list.consume_entries());
        }
        let list_path = format!("{location}/metadata/snap-{snapshot_id}-1-{commit}.avro");
        let list_output = em.encrypt(io.new_output(&list_path).map_err(ierr)?);
        let list_key = list_output.key_metadata().clone();
        let mut lw = ManifestListWriter::v3(
            list_output.writer().await.map_err(ierr)?,
            snapshot_id,
            parent.as_ref().map(|p| p.snapshot_id()),
            seq,
            Some(first_row_id),
        );
        lw.add_manifests(manifests.into_iter()).map_err(ierr)?;
        let next_row_id = lw.next_row_id().unwrap_or(first_row_id);
        written.push(list_path.clone());
        lw.close().await.map_err(ierr)?;
        let list_key =
            list_key.with_file_length(stored_length(io, &list_path).await.map_err(ierr)?);
        let key_id = em
            .encrypt_manifest_list_key_metadata(&list_key)
            .await
            .map_err(ierr)?;
        let summary = crate::commit::summary(
            parent.as_ref().map(|p| p.summary()),
            [
                ("added-data-files", added_files),
                ("added-records", added_rows),
                ("added-files-size", added_size),
                ("deleted-data-files", 0),
                ("deleted-records", 0),
                ("removed-files-size", 0),
            ],
            Operation::Append,
            properties,
        );
        let snapshot = Snapshot::builder()
            .with_snapshot_id(snapshot_id)
            .with_parent_snapshot_id(parent.as_ref().map(|p| p.snapshot_id()))
            .with_sequence_number(seq)
            .with_timestamp_ms(chrono::Utc::now().timestamp_millis())
            .with_manifest_list(list_path)
            .with_summary(summary)
            .with_schema_id(m.current_schema_id())
            .with_encryption_key_id(Some(key_id))
            .with_row_range(first_row_id, next_row_id - first_row_id)
            .build();
        // The key encryption key (if new) and the wrapped manifest list key.
        let mut updates: Vec<TableUpdate> = em.with_encryption_keys(|keys| {
            keys.values()
                .filter(|k| m.encryption_key(k.key_id()).is_none())
                .map(|k| TableUpdate::AddEncryptionKey {
                    encryption_key: k.clone(),
                })
                .collect()
        });
        updates.extend([
            TableUpdate::AddSnapshot { snapshot },
            crate::commit::main_branch_at(snapshot_id),
        ]);
        committer
            .swap_metadata(name, table, updates, &swapped)
            .await
    }
    .await;
    if result.is_err() && !swapped.load(std::sync::atomic::Ordering::SeqCst) {
        for p in &written {
            let _ = io.delete(p).await;
        }
    }
    result.map(|(metadata, _)| metadata)
}

/// The size of the file at `path` as stored.
async fn stored_length(io: &FileIO, path: &str) -> iceberg::Result<u64> {
    Ok(io.new_input(path)?.metadata().await?.size)
}
