//! Everything that decides what a principal may do, in one crate a security reviewer can
//! read whole: the policy's table providers and masks, the write and export rules, the
//! exact row-level writes, DDL under the policy, what a confined (network) session may
//! touch (files, settings, statements), per-principal limits, and the per-query access
//! record the audit log is written from (with quoted values redacted).
//!
//! ```text
//!  Caller ─▶ SessionAccess ─▶ SessionCatalogProvider ─▶ PolicyTableProvider ─▶ scan as
//!  (principal, policy,         (hidden tables absent)    (deny / hide / mask,    ScanGrant:
//!   keys, credential)                                      key scope, audit)      key ids
//!                                                                                  only
//!  statement plan ─▶ write_rules::check_statement ─▶ RowLevelStatement / merge / Ddl
//!                    (NULL-only columns, masked values, export)
//! ```
//!
//! The Iceberg code below (`clearice-iceberg`) never reads the policy: it gets a
//! [`clearice_crypto::ScanGrant`] per scan and a [`clearice_iceberg::dml::WriteTarget`] per
//! write, both decided here.
#![forbid(unsafe_code)]
// Dependencies nothing uses fail the build (tests add dev-dependencies, so not there).
#![cfg_attr(not(test), deny(unused_crate_dependencies))]
#![deny(missing_docs)]

mod access;
mod caller;
mod catalog;
mod cause;
mod class;
pub mod compact;
pub mod confine;
pub mod ddl;
mod encryption;
pub mod fair;
pub mod limits;
pub mod mask;
mod mask_exec;
pub mod merge;
pub mod named;
mod policy_provider;
pub mod redact;
pub mod remote;
pub mod row_level;
mod table_keys;
pub mod write_rules;

pub use access::{Deadline, QueryAccess, SessionAccess, TableAccess};
pub use caller::{Caller, FrontEnd};
pub use catalog::{SessionCatalogProvider, SessionSchemaProvider};
pub use cause::{cause_of, one_line};
pub use class::ErrorClass;
pub use encryption::encryption_spec;
pub use mask_exec::{MaskOutput, PolicyMaskExec};
pub use policy_provider::{PolicyTableProvider, column_kind};
