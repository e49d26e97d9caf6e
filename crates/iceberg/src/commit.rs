//! Commits that remove data files (INSERT OVERWRITE, DELETE, UPDATE): iceberg-rust 0.10.1
//! has only append transactions, so ClearIce produces these snapshots itself, as Iceberg's
//! Java `OverwriteFiles` does:
//!
//! ```text
//!  manifests of the current snapshot ── untouched ones kept as they are
//!                                    └─ ones listing removed files rewritten: those
//!                                       entries DELETED, the others EXISTING
//!  + one manifest of the added files (ADDED)
//!  ─▶ manifest list ─▶ snapshot (operation overwrite|delete, summary totals)
//!  ─▶ new metadata file ─▶ catalog swap, only if the table is still at the metadata
//!     the statement read (else: a conflict, nothing visible)
//! ```
//!
//! The swap is catalog-specific. SQL catalogs (the Iceberg JDBC schema that iceberg-rust,
//! PyIceberg and Java share) are swapped with the same compare-and-set UPDATE their
//! `update_table` runs.

use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::Arc;

use iceberg::spec::TableMetadata;
use iceberg::spec::{
    DataContentType, DataFile, FormatVersion, ManifestContentType, ManifestFile,
    ManifestListWriter, ManifestWriterBuilder, Operation, Snapshot, SnapshotReference,
    SnapshotRetention, Summary,
};
use iceberg::table::Table;
use iceberg::{MetadataLocation, TableUpdate};

use crate::error::{Error, Result};

/// How a catalog takes a commit that removes files.
#[derive(Clone)]
pub enum Committer {
    /// An Iceberg SQL catalog (SQLite or PostgreSQL): compare-and-set on its table row.
    Sql {
        /// The catalog's name in its `catalog_name` column.
        catalog: String,
        /// Connection URI.
        uri: String,
        /// Connected on first use.
        pool: Arc<tokio::sync::OnceCell<sqlx::AnyPool>>,
    },
    /// The catalog cannot take such commits from ClearIce yet.
    Unsupported {
        /// Why.
        reason: String,
    },
}

impl std::fmt::Debug for Committer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Sql { catalog, .. } => write!(f, "Committer::Sql({catalog})"),
            Self::Unsupported { reason } => write!(f, "Committer::Unsupported({reason})"),
        }
    }
}

impl Committer {
    /// A SQL catalog's committer (`uri` as the catalog was opened with).
    pub fn sql(catalog: &str, uri: &str) -> Self {
        Self::Sql {
            catalog: catalog.to_owned(),
            uri: uri.to_owned(),
            pool: Arc::default(),
        }
    }

    /// Swaps `table`'s metadata for `updates` applied to it, if the catalog still points
    /// at the metadata `table` was loaded from; sets `swapped` once the catalog took it
    /// (from then on, nothing written may be removed). Returns the new table.
    pub async fn swap(
        &self,
        name: &str,
        table: &Table,
        updates: Vec<TableUpdate>,
        swapped: &std::sync::atomic::AtomicBool,
    ) -> Result<Table> {
        let (metadata, location) = self.swap_metadata(name, table, updates, swapped).await?;
        Table::builder()
            .metadata(metadata)
            .metadata_location(location)
            .identifier(table.identifier().clone())
            .file_io(table.file_io().clone())
            .runtime(
                iceberg::Runtime::try_current().map_err(|source| Error::Iceberg {
                    table: name.to_owned(),
                    source: Box::new(source),
                })?,
            )
            .build()
            .map_err(|source| Error::Iceberg {
                table: name.to_owned(),
                source: Box::new(source),
            })
    }

    /// [`Self::swap`], returning the new metadata and its location (a table Iceberg
    /// encrypts is built by its catalog, with the KMS).
    pub async fn swap_metadata(
        &self,
        name: &str,
        table: &Table,
        updates: Vec<TableUpdate>,
        swapped: &std::sync::atomic::AtomicBool,
    ) -> Result<(TableMetadata, String)> {
        let name = name.to_owned();
        let ierr = |source: iceberg::Error| Error::Iceberg {
            table: name.clone(),
            source: Box::new(source),
        };
        let (catalog, uri, pool) = match self {
            Self::Sql { catalog, uri, pool } => (catalog, uri, pool),
            Self::Unsupported { reason } => {
                return Err(Error::Unsupported {
                    table: name.clone(),
                    what: format!("removing data files through this catalog ({reason})"),
                });
            }
        };
        let current = table.metadata_location_result().map_err(ierr)?.to_owned();
        let mut builder = table.metadata().clone().into_builder(Some(current.clone()));
        for u in updates {
            builder = u.apply(builder).map_err(ierr)?;
        }
        let metadata = builder.build().map_err(ierr)?.metadata;
        let location = if crate::native::table_key_id(&metadata).is_some() {
            // A table Iceberg encrypts: the file's name carries its hash, so the catalog
            // row vouches for its content (`native::anchored_location`).
            let bytes = serde_json::to_vec(&metadata).map_err(|e| Error::Write {
                table: name.clone(),
                reason: format!("metadata does not serialize: {e}"),
            })?;
            let location =
                crate::native::anchored_location(&current, &bytes).map_err(|e| Error::Write {
                    table: name.clone(),
                    reason: e.to_string(),
                })?;
            table
                .file_io()
                .new_output(&location)
                .map_err(ierr)?
                .write(bytes.into())
                .await
                .map_err(ierr)?;
            location
        } else {
            let location = MetadataLocation::from_str(&current)
                .map_err(ierr)?
                .with_next_version()
                .with_new_metadata(&metadata);
            metadata
                .write_to(table.file_io(), &location)
                .await
                .map_err(ierr)?;
            location.to_string()
        };
        let pool = pool
            .get_or_try_init(|| async {
                sqlx::any::install_default_drivers();
                sqlx::any::AnyPoolOptions::new()
                    .max_connections(2)
                    .connect(uri)
                    .await
            })
            .await
            .map_err(|e| Error::Write {
                table: name.clone(),
                reason: format!("catalog database {}: {e}", crate::catalog::redact_uri(uri)),
            })?;
        let postgres = uri.starts_with("postgres");
        let p = |n: usize| {
            if postgres {
                format!("${n}")
            } else {
                "?".to_owned()
            }
        };
        let sql = format!(
            "UPDATE iceberg_tables SET metadata_location = {}, previous_metadata_location = {} \
             WHERE catalog_name = {} AND table_namespace = {} AND table_name = {} \
             AND metadata_location = {}",
            p(1),
            p(2),
            p(3),
            p(4),
            p(5),
            p(6)
        );
        let ident = table.identifier();
        let done = sqlx::query(&sql)
            .bind(location.clone())
            .bind(current.clone())
            .bind(catalog.clone())
            .bind(ident.namespace().join("."))
            .bind(ident.name().to_owned())
            .bind(current.clone())
            .execute(pool)
            .await
            .map_err(|e| Error::Write {
                table: name.clone(),
                reason: format!("catalog update: {e}"),
            })?;
        if done.rows_affected() == 0 {
            if let Err(e) = table.file_io().delete(&location).await {
                tracing::warn!(file = %location, error = %e, "metadata of a failed commit not removed");
            }
            return Err(Error::Write {
                table: name.clone(),
                reason: "the table changed while the statement ran (another commit came first); nothing was changed, run the statement again".into(),
            });
        }
        swapped.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok((metadata, location))
    }
}

/// Commits one snapshot that removes the data files `removed` (paths) and adds `added`,
/// on the table's `main` branch (with nothing removed: an append). Returns the new
/// metadata. Fails, committing nothing and removing the metadata files it wrote, if the
/// table changed since `table` was loaded.
///
/// Format v3: manifests are assigned row ids, and every kept file of a rewritten
/// manifest stores its inherited `first_row_id` (row lineage). A table Iceberg encrypts
/// itself: manifests and manifest list as AES-GCM streams under their own keys, the
/// list's key wrapped by the table's key encryption key (see `native_write.rs`).
pub async fn commit_overwrite(
    committer: &Committer,
    name: &str,
    table: &Table,
    removed: &HashSet<String>,
    added: Vec<DataFile>,
    operation: Operation,
    properties: HashMap<String, String>,
) -> Result<TableMetadata> {
    let name = name.to_owned();
    let ierr = |source: iceberg::Error| Error::Iceberg {
        table: name.clone(),
        source: Box::new(source),
    };
    let m = table.metadata();
    let v3 = match m.format_version() {
        FormatVersion::V1 => {
            return Err(Error::Unsupported {
                table: name.clone(),
                what: "removing data files from a format 1 table (ClearIce writes these commits for format 2 and 3)".into(),
            });
        }
        FormatVersion::V2 => false,
        FormatVersion::V3 => true,
    };
    let em = match crate::native::table_key_id(m) {
        Some(_) if !v3 => {
            return Err(Error::Unsupported {
                table: name.clone(),
                what: "Iceberg table encryption below format version 3".into(),
            });
        }
        Some(_) => Some(crate::native_write::encryption_manager(table, &name)?),
        None => None,
    };
    let out = Manifests {
        table,
        name: &name,
        em,
        v3,
        written: std::sync::Mutex::default(),
    };
    let parent = m.current_snapshot().cloned();
    let snapshot_id = new_snapshot_id(m);
    let seq = m.next_sequence_number();
    let first_row_id = v3.then(|| m.next_row_id());
    let location = m.location().trim_end_matches('/').to_owned();
    let commit = uuid_like();
    let io = table.file_io();
    let mut manifests: Vec<ManifestFile> = Vec::new();
    let (mut removed_files, mut removed_rows, mut removed_size) = (0u64, 0u64, 0u64);
    // Deletion vectors of removed data files, removed with them (format 3).
    let (mut removed_dvs, mut removed_dv_rows) = (0u64, 0u64);
    let swapped = std::sync::atomic::AtomicBool::new(false);
    let result = async {
        if let Some(parent) = &parent {
            let list = table
                .manifest_list_reader(parent)
                .load()
                .await
                .map_err(ierr)?;
            let entries: Vec<ManifestFile> = list.consume_entries().into_iter().collect();
            for (n, mf) in entries.into_iter().enumerate() {
                if mf.content == ManifestContentType::Deletes && v3 && !removed.is_empty() {
                    let (kept, dvs, rows) = out
                        .without_dvs_of(mf, removed, snapshot_id, parent.snapshot_id(), &format!("{location}/metadata/{commit}-d{n}.avro"))
                        .await?;
                    manifests.push(kept);
                    removed_dvs += dvs;
                    removed_dv_rows += rows;
                    continue;
                }
                if mf.content != ManifestContentType::Data || removed.is_empty() {
                    manifests.push(mf);
                    continue;
                }
                let manifest = mf.load_manifest(io).await.map_err(ierr)?;
                let touched = manifest
                    .entries()
                    .iter()
                    .any(|e| e.is_alive() && removed.contains(e.file_path()));
                if !touched {
                    manifests.push(mf);
                    continue;
                }
                let spec = m
                    .partition_spec_by_id(mf.partition_spec_id)
                    .ok_or_else(|| Error::Write {
                        table: name.clone(),
                        reason: format!("manifest '{}' names an unknown partition spec", mf.manifest_path),
                    })?;
                let row_ids = crate::lineage::first_row_ids(&mf, &manifest);
                let path = format!("{location}/metadata/{commit}-m{n}.avro");
                let mut w = out.writer(&path, snapshot_id, spec.as_ref().clone())?;
                for (e, row_id) in manifest.entries().iter().zip(row_ids) {
                    if !e.is_alive() {
                        continue;
                    }
                    let seq_n = e.sequence_number().unwrap_or(0);
                    let file_seq = e.file_sequence_number.or(Some(seq_n));
                    // A kept (or deleted) entry stores the first row id it inherited.
                    let file = if v3 && e.data_file().first_row_id().is_none() && row_id.is_some() {
                        crate::lineage::with_first_row_id(e.data_file(), mf.partition_spec_id, row_id)
                            .map_err(|reason| Error::Write { table: name.clone(), reason })?
                    } else {
                        e.data_file().clone()
                    };
                    if removed.contains(e.file_path()) {
                        removed_files += 1;
                        removed_rows += e.record_count();
                        removed_size += e.file_size_in_bytes();
                        w.add_delete_file(file, seq_n, file_seq).map_err(ierr)?;
                    } else {
                        w.add_existing_file(
                            file,
                            e.snapshot_id().unwrap_or(parent.snapshot_id()),
                            seq_n,
                            file_seq,
                        )
                        .map_err(ierr)?;
                    }
                }
                manifests.push(out.finish(w, &path).await?);
            }
        }
        if removed_files as usize != removed.len() {
            return Err(Error::Write {
                table: name.clone(),
                reason: "a file to remove is no longer in the table (another commit removed it); run the statement again".into(),
            });
        }
        let (added_files, added_rows, added_size) = (
            added.len() as u64,
            added.iter().map(DataFile::record_count).sum::<u64>(),
            added.iter().map(DataFile::file_size_in_bytes).sum::<u64>(),
        );
        if !added.is_empty() {
            let path = format!("{location}/metadata/{commit}-m-added.avro");
            let mut w = out.writer(&path, snapshot_id, m.default_partition_spec().as_ref().clone())?;
            for f in added {
                debug_assert_eq!(f.content_type(), DataContentType::Data);
                w.add_file(f, seq).map_err(ierr)?;
            }
            manifests.push(out.finish(w, &path).await?);
        }
        // Manifests are listed newest first.
        manifests.sort_by_key(|mf| std::cmp::Reverse(mf.added_snapshot_id == snapshot_id));
        let list_path = format!("{location}/metadata/snap-{snapshot_id}-1-{commit}.avro");
        let parent_id = parent.as_ref().map(|p| p.snapshot_id());
        let (key_id, next_row_id) = out
            .manifest_list(&list_path, snapshot_id, parent_id, seq, first_row_id, manifests)
            .await?;
        let summary = summary(
            parent.as_ref().map(|p| p.summary()),
            [
                ("added-data-files", added_files),
                ("added-records", added_rows),
                ("added-files-size", added_size),
                ("deleted-data-files", removed_files),
                ("deleted-records", removed_rows),
                ("removed-files-size", removed_size),
            ],
            (removed_dvs, removed_dv_rows),
            operation,
            properties,
        );
        let snapshot = Snapshot::builder()
            .with_snapshot_id(snapshot_id)
            .with_parent_snapshot_id(parent_id)
            .with_sequence_number(seq)
            .with_timestamp_ms(chrono::Utc::now().timestamp_millis())
            .with_manifest_list(list_path)
            .with_summary(summary)
            .with_schema_id(m.current_schema_id())
            .with_encryption_key_id(key_id);
        let snapshot = match (first_row_id, next_row_id) {
            (Some(first), Some(next)) => snapshot.with_row_range(first, next - first).build(),
            _ => snapshot.build(),
        };
        // A table Iceberg encrypts: the key encryption key, if new.
        let mut updates: Vec<TableUpdate> = em
            .map(|em| {
                em.with_encryption_keys(|keys| {
                    keys.values()
                        .filter(|k| m.encryption_key(k.key_id()).is_none())
                        .map(|k| TableUpdate::AddEncryptionKey {
                            encryption_key: k.clone(),
                        })
                        .collect()
                })
            })
            .unwrap_or_default();
        updates.extend([
            TableUpdate::AddSnapshot { snapshot },
            main_branch_at(snapshot_id),
        ]);
        committer
            .swap_metadata(&name, table, updates, &swapped)
            .await
    }
    .await;
    if result.is_err() && !swapped.load(std::sync::atomic::Ordering::SeqCst) {
        let written = std::mem::take(&mut *out.written.lock().expect("written"));
        for p in &written {
            let _ = io.delete(p).await;
        }
    }
    result.map(|(metadata, _)| metadata)
}

/// Writes one commit's manifests and manifest list in the table's format, encrypted if
/// Iceberg encrypts the table; remembers what it wrote (removed if the commit fails).
struct Manifests<'a> {
    table: &'a Table,
    name: &'a str,
    em: Option<&'a iceberg::encryption::EncryptionManager>,
    v3: bool,
    written: std::sync::Mutex<Vec<String>>,
}

impl Manifests<'_> {
    fn ierr(&self) -> impl Fn(iceberg::Error) -> Error + '_ {
        |source| Error::Iceberg {
            table: self.name.to_owned(),
            source: Box::new(source),
        }
    }

    /// A data manifest writer at `path` for partition spec `spec`.
    fn writer(
        &self,
        path: &str,
        snapshot_id: i64,
        spec: iceberg::spec::PartitionSpec,
    ) -> Result<iceberg::spec::ManifestWriter> {
        self.writer_of(ManifestContentType::Data, path, snapshot_id, spec)
    }

    /// A manifest writer of `content` at `path` for partition spec `spec`.
    fn writer_of(
        &self,
        content: ManifestContentType,
        path: &str,
        snapshot_id: i64,
        spec: iceberg::spec::PartitionSpec,
    ) -> Result<iceberg::spec::ManifestWriter> {
        let deletes = content == ManifestContentType::Deletes;
        let ierr = self.ierr();
        let io = self.table.file_io();
        let schema = Arc::clone(self.table.metadata().current_schema());
        self.written.lock().expect("written").push(path.to_owned());
        let output = io.new_output(path).map_err(&ierr)?;
        Ok(match self.em {
            Some(em) => ManifestWriterBuilder::new_from_encrypted(
                em.encrypt(output),
                Some(snapshot_id),
                schema,
                spec,
            )
            .map_err(&ierr)
            .map(|b| {
                if deletes {
                    b.build_v3_deletes()
                } else {
                    b.build_v3_data()
                }
            })?,
            None => {
                let b = ManifestWriterBuilder::new(output, Some(snapshot_id), schema, spec);
                match (self.v3, deletes) {
                    (true, false) => b.build_v3_data(),
                    (true, true) => b.build_v3_deletes(),
                    (false, false) => b.build_v2_data(),
                    (false, true) => b.build_v2_deletes(),
                }
            }
        })
    }

    /// Delete manifest `mf` without the deletion vectors of data files `removed`: `mf`
    /// itself if it has none of them, else a rewrite at `path` (those entries DELETED,
    /// the others EXISTING). Returns it, the vectors removed and the positions they held.
    async fn without_dvs_of(
        &self,
        mf: ManifestFile,
        removed: &HashSet<String>,
        snapshot_id: i64,
        parent_id: i64,
        path: &str,
    ) -> Result<(ManifestFile, u64, u64)> {
        let ierr = self.ierr();
        let manifest = mf
            .load_manifest(self.table.file_io())
            .await
            .map_err(&ierr)?;
        let of_removed = |e: &iceberg::spec::ManifestEntry| {
            e.is_alive()
                && e.data_file().file_format() == iceberg::spec::DataFileFormat::Puffin
                && e.data_file()
                    .referenced_data_file()
                    .is_some_and(|f| removed.contains(&f))
        };
        if !manifest.entries().iter().any(|e| of_removed(e)) {
            return Ok((mf, 0, 0));
        }
        let spec = self
            .table
            .metadata()
            .partition_spec_by_id(mf.partition_spec_id)
            .ok_or_else(|| Error::Write {
                table: self.name.to_owned(),
                reason: format!(
                    "manifest '{}' names an unknown partition spec",
                    mf.manifest_path
                ),
            })?;
        let mut w = self.writer_of(
            ManifestContentType::Deletes,
            path,
            snapshot_id,
            spec.as_ref().clone(),
        )?;
        let (mut dvs, mut rows) = (0u64, 0u64);
        for e in manifest.entries() {
            if !e.is_alive() {
                continue;
            }
            let seq_n = e.sequence_number().unwrap_or(0);
            let file_seq = e.file_sequence_number.or(Some(seq_n));
            if of_removed(e) {
                dvs += 1;
                rows += e.record_count();
                w.add_delete_file(e.data_file().clone(), seq_n, file_seq)
                    .map_err(&ierr)?;
            } else {
                w.add_existing_file(
                    e.data_file().clone(),
                    e.snapshot_id().unwrap_or(parent_id),
                    seq_n,
                    file_seq,
                )
                .map_err(&ierr)?;
            }
        }
        Ok((self.finish(w, path).await?, dvs, rows))
    }

    /// Writes the manifest of `w` (at `path`). An encrypted one records its stored length,
    /// in its entry and its key metadata, as Iceberg Java does (readers refuse an AES-GCM
    /// stream without it: truncation).
    async fn finish(&self, w: iceberg::spec::ManifestWriter, path: &str) -> Result<ManifestFile> {
        let ierr = self.ierr();
        let mut manifest = w.write_manifest_file().await.map_err(&ierr)?;
        if self.em.is_some() {
            let stored = crate::native_write::stored_length(self.table.file_io(), path)
                .await
                .map_err(&ierr)?;
            manifest.manifest_length = stored as i64;
            if let Some(k) = &manifest.key_metadata {
                let k = iceberg::encryption::StandardKeyMetadata::decode(k)
                    .map_err(&ierr)?
                    .with_file_length(stored);
                manifest.key_metadata = Some(k.encode().map_err(&ierr)?.to_vec());
            }
        }
        Ok(manifest)
    }

    /// Writes the manifest list at `path`; returns the id of its wrapped key (an
    /// encrypted list) and the next row id (format v3).
    async fn manifest_list(
        &self,
        path: &str,
        snapshot_id: i64,
        parent_id: Option<i64>,
        seq: i64,
        first_row_id: Option<u64>,
        manifests: Vec<ManifestFile>,
    ) -> Result<(Option<String>, Option<u64>)> {
        let ierr = self.ierr();
        let io = self.table.file_io();
        self.written.lock().expect("written").push(path.to_owned());
        let output = io.new_output(path).map_err(&ierr)?;
        let (writer, list_key) = match self.em {
            Some(em) => {
                let encrypted = em.encrypt(output);
                let key = encrypted.key_metadata().clone();
                (encrypted.writer().await.map_err(&ierr)?, Some((em, key)))
            }
            None => (output.writer().await.map_err(&ierr)?, None),
        };
        let mut lw = if self.v3 {
            ManifestListWriter::v3(writer, snapshot_id, parent_id, seq, first_row_id)
        } else {
            ManifestListWriter::v2(writer, snapshot_id, parent_id, seq)
        };
        lw.add_manifests(manifests.into_iter()).map_err(&ierr)?;
        let next_row_id = if self.v3 {
            lw.next_row_id().or(first_row_id)
        } else {
            None
        };
        lw.close().await.map_err(&ierr)?;
        let key_id = match list_key {
            Some((em, key)) => {
                let key = key.with_file_length(
                    crate::native_write::stored_length(io, path)
                        .await
                        .map_err(&ierr)?,
                );
                Some(
                    em.encrypt_manifest_list_key_metadata(&key)
                        .await
                        .map_err(&ierr)?,
                )
            }
            None => None,
        };
        Ok((key_id, next_row_id))
    }
}

/// A snapshot summary: the change's counts, and the totals carried from the parent's.
pub(crate) fn summary(
    parent: Option<&Summary>,
    change: [(&str, u64); 6],
    (removed_dvs, removed_dv_rows): (u64, u64),
    operation: Operation,
    properties: HashMap<String, String>,
) -> Summary {
    let get = |k: &str| -> u64 {
        parent
            .and_then(|s| s.additional_properties.get(k))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let c: HashMap<&str, u64> = change.into_iter().collect();
    let mut props = properties;
    for (k, v) in &c {
        if *v > 0 {
            props.insert((*k).to_owned(), v.to_string());
        }
    }
    let total = |k: &str, add: &str, del: &str| {
        (
            k.to_owned(),
            (get(k) + c[add]).saturating_sub(c[del]).to_string(),
        )
    };
    props.extend([
        total("total-data-files", "added-data-files", "deleted-data-files"),
        total("total-records", "added-records", "deleted-records"),
        total("total-files-size", "added-files-size", "removed-files-size"),
    ]);
    if removed_dvs > 0 {
        props.insert("removed-dvs".into(), removed_dvs.to_string());
        props.insert("removed-delete-files".into(), removed_dvs.to_string());
        props.insert(
            "removed-position-deletes".into(),
            removed_dv_rows.to_string(),
        );
    }
    for (k, less) in [
        ("total-delete-files", removed_dvs),
        ("total-position-deletes", removed_dv_rows),
        ("total-equality-deletes", 0),
    ] {
        props.insert(k.to_owned(), get(k).saturating_sub(less).to_string());
    }
    Summary {
        operation,
        additional_properties: props,
    }
}

/// A snapshot id `m` does not have (positive, non-zero).
pub(crate) fn new_snapshot_id(m: &TableMetadata) -> i64 {
    loop {
        let id = (rand::random::<u64>() >> 1) as i64;
        if id != 0 && m.snapshot_by_id(id).is_none() {
            return id;
        }
    }
}

/// The update that points the table's `main` branch at `snapshot_id`.
pub(crate) fn main_branch_at(snapshot_id: i64) -> TableUpdate {
    TableUpdate::SetSnapshotRef {
        ref_name: iceberg::spec::MAIN_BRANCH.to_owned(),
        reference: SnapshotReference::new(snapshot_id, SnapshotRetention::branch(None, None, None)),
    }
}

/// A random 128-bit id in hex (names of the commit's metadata files).
pub(crate) fn uuid_like() -> String {
    format!("{:032x}", rand::random::<u128>())
}
