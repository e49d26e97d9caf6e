//! Iceberg tables in DataFusion with transparent Parquet Modular Encryption.
//!
//! ```text
//!  SQL ─▶ IcebergCatalogProvider ─▶ IcebergSchemaProvider ─▶ IcebergTableProvider
//!                                                             │ plan_files(filters)
//!                                                             ▼
//!              DataSourceExec(ParquetSource + pme::DecryptingReaderFactory + field-id adapter)
//! ```
//!
//! Catalogs come from [`open_sql_catalog`]; encrypted writes from [`mod@write`].
// Dependencies nothing uses fail the build (tests add dev-dependencies, so not there).
#![cfg_attr(not(test), deny(unused_crate_dependencies))]
#![deny(missing_docs)]

mod access;
mod catalog;
pub mod commit;
pub mod ddl;
mod deletes;
pub mod dml;
mod error;
mod exec;
pub mod field_id;
mod filter;
pub mod mask;
pub mod merge;
pub mod metadata;
pub mod pme;
mod policy_provider;
mod provider;
pub mod remote;
pub mod row_level;
mod schema;
pub mod storage;
pub mod travel;
pub mod write;

pub use access::{QueryAccess, SessionAccess, TableAccess, WriteAudit, WriteReport};
pub use catalog::{
    IcebergCatalogProvider, IcebergSchemaProvider, SessionCatalogProvider, SessionSchemaProvider,
    open_hms_catalog, open_rest_catalog, open_sql_catalog, open_sql_catalog_with, redact_uri,
};
pub use deletes::IcebergDeletesExec;
pub use error::{Error, Result};
pub use filter::to_iceberg_predicate;
pub use policy_provider::{MaskOutput, PolicyMaskExec, PolicyTableProvider, column_kind};
pub use provider::{AsOf, CATALOG_STORE_URL, IcebergSnapshotExec, IcebergTableProvider, ScanAs};
pub use schema::arrow_schema;
