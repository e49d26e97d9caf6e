//! The audit record: one JSON line per query per table (Ranger-like fields). Holds
//! decisions and counts, never values or key material.

use serde::Serialize;

/// One column's decision in an audit record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditColumn {
    /// Column name.
    pub name: String,
    /// `plaintext`, a mask name, `hide` or `deny`.
    pub decision: String,
    /// The rule that decided (`role:analyst`, `user:bob`, `*`, default...).
    pub rule: String,
    /// Whether the column was decrypted for this query.
    pub decrypted: bool,
}

/// One query's access to one table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditRecord {
    /// RFC 3339 UTC time the record was written.
    pub time: String,
    /// Principal.
    pub user: String,
    /// Client: `repl`, `cli`, `slt`, or a network address.
    pub client: String,
    /// What was attempted: `query` (a table read under the policy), `read_file`,
    /// `write_file`, `set`, `statement` (refused by confinement), `limit` (stopped by a
    /// resource limit), `login` (a failed or throttled login).
    pub action: String,
    /// Query id (unique per process run).
    pub query_id: String,
    /// SHA-256 of the SQL text (hex); the text itself is not logged.
    pub sql_sha256: String,
    /// `catalog.namespace.table`.
    pub table: String,
    /// The snapshot the query read (absent for events that read no table).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<i64>,
    /// Columns the query used, with decisions.
    pub columns: Vec<AuditColumn>,
    /// The row filter the read was under (rule and predicate), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub row_filter: Option<String>,
    /// Whether access was allowed.
    pub allowed: bool,
    /// Rows returned by the query (None when it failed).
    pub rows: Option<u64>,
    /// The error, if the query failed.
    pub error: Option<String>,
    /// Attempts of the query that were stopped and run again (a cluster worker lost
    /// before the query returned a row), one line each; absent when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub retries: Vec<String>,
}
