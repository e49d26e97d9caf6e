//! Iceberg tables in DataFusion, read and written with Parquet Modular Encryption.
//!
//! ```text
//!  SQL ─▶ IcebergCatalogProvider ─▶ IcebergSchemaProvider ─▶ IcebergTableProvider
//!                                                             │ plan_files(filters)
//!                                                             ▼
//!              DataSourceExec(ParquetSource + clearice_pme::DecryptingReaderFactory
//!                             + field-id adapter) ─▶ IcebergDeletesExec (position and
//!                                                     equality deletes)
//!  writes: WriteTarget ─▶ FileWriter (PME) ─▶ one Iceberg commit (append, copy-on-write
//!          in commit.rs; format 3 keeps row lineage, lineage.rs; tables Iceberg
//!          encrypts: per-file keys, native_write.rs, and encrypted manifests)
//! ```
//!
//! This crate knows keys and key ids, never principals' rights: what a scan may decrypt
//! arrives as a [`clearice_crypto::ScanGrant`] and what a write may touch as a [`dml::WriteTarget`], both
//! decided by `clearice-access`, which alone reads the policy. Catalogs come from
//! [`open_sql_catalog`], [`open_rest_catalog`] and [`open_hms_catalog`]; encrypted writes
//! from [`mod@write`]. Tables Iceberg encrypts itself (format v3 `encryption.key-id`) load
//! through [`native::NativeCatalog`], scan with each file's own key, and take appends,
//! overwrites, DELETE and UPDATE through [`native_write`] (per-file keys) and
//! [`commit::commit_overwrite`] (encrypted manifests).
#![forbid(unsafe_code)]
// Dependencies nothing uses fail the build (tests add dev-dependencies, so not there).
#![cfg_attr(not(test), deny(unused_crate_dependencies))]
#![deny(missing_docs)]

mod catalog;
pub mod commit;
pub mod ddl;
mod deletes;
pub mod dml;
mod error;
pub mod exec;
pub mod field_id;
mod filter;
pub mod lineage;
mod loaded;
pub mod metadata;
pub mod native;
pub mod native_write;
pub mod parquet_layout;
mod provider;
mod report;
pub mod restrictions;
mod schema;
mod snapshot_exec;
pub mod sql;
mod statistics;
pub mod travel;
pub mod write;

pub use catalog::{
    IcebergCatalogProvider, IcebergSchemaProvider, UnreadableTable, open_hms_catalog,
    open_rest_catalog, open_sql_catalog, open_sql_catalog_with, redact_uri, unreadable,
};
pub use deletes::IcebergDeletesExec;
pub use error::{Error, Result};
pub use filter::to_iceberg_predicate;
pub use metadata::metadata_table;
pub use provider::{
    AsOf, CATALOG_STORE_URL, FILE_COLUMN, IcebergSnapshotExec, IcebergTableProvider, Shown,
};
pub use report::{WriteAudit, WriteReport};
pub use schema::arrow_schema;
