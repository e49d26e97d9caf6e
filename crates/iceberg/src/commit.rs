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
    ) -> Result<(iceberg::spec::TableMetadata, String)> {
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
/// on the table's `main` branch. Returns the new table. Fails, committing nothing, if the
/// table changed since `table` was loaded.
pub async fn commit_overwrite(
    committer: &Committer,
    name: &str,
    table: &Table,
    removed: &HashSet<String>,
    added: Vec<DataFile>,
    operation: Operation,
    properties: HashMap<String, String>,
) -> Result<Table> {
    let name = name.to_owned();
    let ierr = |source: iceberg::Error| Error::Iceberg {
        table: name.clone(),
        source: Box::new(source),
    };
    let m = table.metadata();
    if m.format_version() != FormatVersion::V2 {
        return Err(Error::Unsupported {
            table: name.clone(),
            what: format!(
                "removing data files from a format {} table (ClearIce writes these commits for v2 tables)",
                m.format_version()
            ),
        });
    }
    let parent = m.current_snapshot().cloned();
    let snapshot_id = new_snapshot_id(m);
    let seq = m.next_sequence_number();
    let location = m.location().trim_end_matches('/').to_owned();
    let commit = uuid_like();
    let io = table.file_io();
    let mut manifests: Vec<ManifestFile> = Vec::new();
    let (mut removed_files, mut removed_rows, mut removed_size) = (0u64, 0u64, 0u64);
    let mut written: Vec<String> = Vec::new();
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
                let path = format!("{location}/metadata/{commit}-m{n}.avro");
                let mut w = ManifestWriterBuilder::new(
                    io.new_output(&path).map_err(ierr)?,
                    Some(snapshot_id),
                    Arc::clone(m.current_schema()),
                    spec.as_ref().clone(),
                )
                .build_v2_data();
                for e in manifest.entries() {
                    if !e.is_alive() {
                        continue;
                    }
                    let seq_n = e.sequence_number().unwrap_or(0);
                    let file_seq = e.file_sequence_number.or(Some(seq_n));
                    if removed.contains(e.file_path()) {
                        removed_files += 1;
                        removed_rows += e.record_count();
                        removed_size += e.file_size_in_bytes();
                        w.add_delete_file(e.data_file().clone(), seq_n, file_seq)
                            .map_err(ierr)?;
                    } else {
                        w.add_existing_file(
                            e.data_file().clone(),
                            e.snapshot_id().unwrap_or(parent.snapshot_id()),
                            seq_n,
                            file_seq,
                        )
                        .map_err(ierr)?;
                    }
                }
                written.push(path);
                manifests.push(w.write_manifest_file().await.map_err(ierr)?);
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
            let mut w = ManifestWriterBuilder::new(
                io.new_output(&path).map_err(ierr)?,
                Some(snapshot_id),
                Arc::clone(m.current_schema()),
                m.default_partition_spec().as_ref().clone(),
            )
            .build_v2_data();
            for f in added {
                debug_assert_eq!(f.content_type(), DataContentType::Data);
                w.add_file(f, seq).map_err(ierr)?;
            }
            written.push(path);
            manifests.push(w.write_manifest_file().await.map_err(ierr)?);
        }
        // Manifests are listed newest first.
        manifests.sort_by_key(|mf| std::cmp::Reverse(mf.added_snapshot_id == snapshot_id));
        let list_path = format!("{location}/metadata/snap-{snapshot_id}-1-{commit}.avro");
        let mut lw = ManifestListWriter::v2(
            io.new_output(&list_path).map_err(ierr)?.writer().await.map_err(ierr)?,
            snapshot_id,
            parent.as_ref().map(|p| p.snapshot_id()),
            seq,
        );
        lw.add_manifests(manifests.into_iter()).map_err(ierr)?;
        written.push(list_path.clone());
        lw.close().await.map_err(ierr)?;
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
            operation,
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
            .build();
        committer
            .swap(
                &name,
                table,
                vec![
                    TableUpdate::AddSnapshot { snapshot },
                    main_branch_at(snapshot_id),
                ],
                &swapped,
            )
            .await
    }
    .await;
    if result.is_err() && !swapped.load(std::sync::atomic::Ordering::SeqCst) {
        for p in &written {
            let _ = io.delete(p).await;
        }
    }
    result
}

/// A snapshot summary: the change's counts, and the totals carried from the parent's.
pub(crate) fn summary(
    parent: Option<&Summary>,
    change: [(&str, u64); 6],
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
    for k in [
        "total-delete-files",
        "total-position-deletes",
        "total-equality-deletes",
    ] {
        props.insert(k.to_owned(), get(k).to_string());
    }
    Summary {
        operation,
        additional_properties: props,
    }
}

/// A snapshot id `m` does not have (positive, non-zero).
pub(crate) fn new_snapshot_id(m: &iceberg::spec::TableMetadata) -> i64 {
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
