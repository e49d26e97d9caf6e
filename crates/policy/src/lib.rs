//! The ClearIce column policy: who sees what of each encrypted column, and how columns
//! are protected on write. Pure: no IO, no async, no DataFusion.
//!
//! ```text
//!  policy.toml ─▶ Policy::parse (validated: roles, users, tables, columns, masks, areas)
//!  (principal, table, column) ─▶ Policy::decide ─▶ Decision (plaintext, mask, hide, deny)
//!                                                  + the rule that decided, for the audit
//!  (principal, table, column) ─▶ may_write_table / may_write_column / may_export ─▶ bool
//!  Ranger export (JSON) + base policy ─▶ import_ranger ─▶ policy text + notes
//!  REST catalog's read-restrictions (JSON) ─▶ ReadRestrictions::parse ─▶ masks + row filter
//! ```
//!
//! ```
//! use clearice_policy::{Decision, Mask, Policy};
//! let p = Policy::parse(r#"
//! [roles]
//! analyst = {}
//! [users]
//! ann = { roles = ["analyst"] }
//! [tables."lake.sales.customers".columns.ssn]
//! master_key = "pii_key"
//! access = { analyst = "show_last_4" }
//! "#, "policy.toml").unwrap();
//! assert_eq!(p.decide("ann", "lake.sales.customers", "ssn").decision, Decision::Mask(Mask::ShowLast4));
//! assert_eq!(p.decide("ann", "lake.sales.customers", "name").decision, Decision::Plaintext);
//! ```
#![forbid(unsafe_code)]
// Dependencies nothing uses fail the build (tests add dev-dependencies, so not there).
#![cfg_attr(not(test), deny(unused_crate_dependencies))]
#![deny(missing_docs)]

mod audit;
mod error;
mod model;
mod policy;
mod ranger;
mod restrictions;

pub use audit::{AuditColumn, AuditRecord};
pub use error::{Error, Result};
pub use model::{
    CatalogMask, ColumnKind, Decision, Mask, MissingKey, Resolved, RuleSource, TableDecision,
};
pub use policy::{
    Area, ColumnPolicy, LOCAL_PROVIDER, Policy, RowFilter, Subject, TablePolicy, Tag,
    parse_decision, pattern_matches,
};
pub use ranger::{RangerImport, RangerOptions, import_ranger};
pub use restrictions::{CompareOp, Literal, Projection, ReadRestrictions, RowPredicate, UnaryOp};
