//! Policy file parsing, validation and evaluation: the policy model (subjects; table,
//! column and area policies; the validated [`Policy`] and its lookups) is here, parsing
//! and validation in `parse`, access decisions in `decide`.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{Decision, MissingKey, TableDecision};

mod decide;
mod parse;
mod tags;

pub use parse::parse_decision;
pub use tags::pattern_matches;

/// Who a rule applies to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Subject {
    /// `user:NAME`.
    User(String),
    /// A role name.
    Role(String),
    /// `*`: everyone.
    Wildcard,
}

/// One column's protection and access rules.
#[derive(Debug, Clone, Default)]
pub struct ColumnPolicy {
    /// Master key id the column is encrypted under (protection for writes; also tells
    /// the reader which key a rule needs).
    pub master_key: Option<String>,
    /// Crypto provider protecting the column (`local` or a `[providers.NAME]`); default:
    /// the table's.
    pub provider: Option<String>,
    /// Override of the policy-wide `on_missing_key`.
    pub on_missing_key: Option<MissingKey>,
    /// Access rules.
    pub rules: Vec<(Subject, Decision)>,
    /// Who may write values into the column when it is protected (`write`); nobody if
    /// empty. Unprotected columns follow the table's `write`.
    pub write: Vec<Subject>,
    /// Tags the column is classified with (`tags = [...]`), beside those whose
    /// `columns` patterns match it.
    pub tags: Vec<String>,
    /// The access rules of every tag of the column (explicit and matched), filled by
    /// [`Policy::column_policy`]: for a principal the column's own rules do not decide,
    /// the strictest of its tags' decisions applies.
    pub tag_rules: Vec<(String, Vec<(Subject, Decision)>)>,
    /// Tags of the column that declare different master keys: the column is denied to
    /// everyone (which key would protect it is not decided).
    pub key_conflict: Option<String>,
}

impl ColumnPolicy {
    /// Every principal reads the column in plaintext: a `*` rule, and every rule
    /// `plaintext` (no mask, hide or deny for anyone).
    pub fn plaintext_to_everyone(&self) -> bool {
        self.tag_rules.is_empty()
            && self.key_conflict.is_none()
            && self.rules.iter().any(|(s, _)| *s == Subject::Wildcard)
            && self.rules.iter().all(|(_, d)| *d == Decision::Plaintext)
    }
}

/// One table's protection and columns.
#[derive(Debug, Clone, Default)]
pub struct TablePolicy {
    /// Master key id of the footer key for writes.
    pub footer_key: Option<String>,
    /// Write the footer in plaintext (signed).
    pub plaintext_footer: bool,
    /// AAD prefix of the table's files (UTF-8), for files that do not store it; when set,
    /// it is also checked against a stored one.
    pub aad_prefix: Option<String>,
    /// Crypto provider of the table's keys (`local` or a `[providers.NAME]`); default
    /// `local`.
    pub provider: Option<String>,
    /// Table-level access rules (no matching rule: allowed).
    pub access: Vec<(Subject, TableDecision)>,
    /// Who may change the table's rows and definition (INSERT, DELETE, UPDATE, MERGE,
    /// ALTER, DROP); `None`: the policy's `[writes] create`.
    pub write: Option<Vec<Subject>>,
    /// Who may export (`COPY ... TO`) the table's protected columns decrypted.
    pub export: Vec<Subject>,
    /// Columns by name.
    pub columns: BTreeMap<String, ColumnPolicy>,
    /// Row filters (`[tables."t".row_filter]`): subject → SQL predicate over the table's
    /// columns; see [`Policy::row_filter`].
    pub row_filter: Vec<(Subject, String)>,
    /// Override of the policy-wide `hide_inaccessible_columns`.
    pub hide_inaccessible_columns: Option<bool>,
}

/// The name of the in-process crypto provider (the default of every table).
pub const LOCAL_PROVIDER: &str = "local";

impl TablePolicy {
    /// The crypto provider of the table's keys: its `provider`, else `local`.
    pub fn default_provider(&self) -> &str {
        self.provider.as_deref().unwrap_or(LOCAL_PROVIDER)
    }

    /// The crypto provider of each master key the columns name: the column's `provider`,
    /// else the table's.
    pub fn key_providers(&self) -> BTreeMap<String, String> {
        self.columns
            .values()
            .filter_map(|c| {
                let provider = c.provider.as_deref().unwrap_or(self.default_provider());
                Some((c.master_key.clone()?, provider.to_owned()))
            })
            .collect()
    }
}

/// The rows one principal may see of a table ([`Policy::row_filter`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowFilter {
    /// SQL predicates over the table's columns, any of which lets a row through (one per
    /// matching rule; `principal()` and `principal_attr('x')` still to be substituted).
    pub predicates: Vec<String>,
    /// Which rules it comes from, for EXPLAIN, errors and the audit log.
    pub rule: String,
}

/// A classification (`[tags.NAME]`): the columns it applies to wherever they appear
/// (patterns, and columns that name it in `tags`), how they are protected on write and
/// who sees what of them.
#[derive(Debug, Clone, Default)]
pub struct Tag {
    /// Column patterns: `catalog.namespace.table.column` with `*` for any one part (the
    /// namespace may have several parts), or a bare column name for every table.
    pub columns: Vec<String>,
    /// Master key of the columns it applies to (unless the column declares its own).
    pub master_key: Option<String>,
    /// Footer key of a table without its own `footer_key` whose columns this tag
    /// encrypts (default: `master_key`).
    pub footer_key: Option<String>,
    /// Crypto provider of that key.
    pub provider: Option<String>,
    /// Access rules; a principal none matches is denied the column.
    pub rules: Vec<(Subject, Decision)>,
    /// Who may write values into its protected columns.
    pub write: Vec<Subject>,
}

/// A named directory that confined sessions (Flight SQL) may read files from by path
/// (`read`) or export query results into (`write`), per `[areas.NAME]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Area {
    /// Area name (for messages and the audit log).
    pub name: String,
    /// Root directory as written (relative: to the policy file's directory).
    pub root: String,
    /// Who may read files under the root by path.
    pub read: Vec<Subject>,
    /// Who may write (`COPY ... TO`) under the root.
    pub write: Vec<Subject>,
}

/// A validated column policy.
#[derive(Debug, Clone)]
pub struct Policy {
    source: String,
    users: BTreeMap<String, Vec<String>>,
    /// `[users.NAME] attributes`: what row filters read with `principal_attr`.
    attributes: BTreeMap<String, BTreeMap<String, String>>,
    roles: BTreeSet<String>,
    file_decrypt: Vec<Subject>,
    areas: Vec<Area>,
    tables: BTreeMap<String, TablePolicy>,
    on_missing_key: MissingKey,
    /// `hide_inaccessible_columns` (as Trino's): a column the policy denies a principal
    /// is hidden from it instead (absent from `SELECT *` and metadata; naming it is an
    /// error as for a column that does not exist).
    hide_inaccessible_columns: bool,
    /// `[writes] create`: who may create and drop schemas and tables, and write tables
    /// without their own `write`.
    creators: Vec<Subject>,
    /// `[masks] hmac_key_file`: the file holding the `hmac_sha256` mask's secret, as
    /// written (relative: to the policy file's directory). The policy never holds the
    /// secret itself; the engine reads it.
    hmac_key_file: Option<String>,
    /// `[tags.NAME]`.
    tags: BTreeMap<String, Tag>,
}

impl Policy {
    /// An empty policy: everyone sees plaintext (used when no policy file is configured).
    pub fn open(source: &str) -> Self {
        Self {
            source: source.into(),
            users: BTreeMap::new(),
            attributes: BTreeMap::new(),
            roles: BTreeSet::new(),
            file_decrypt: vec![Subject::Wildcard],
            areas: Vec::new(),
            tables: BTreeMap::new(),
            on_missing_key: MissingKey::Error,
            hide_inaccessible_columns: false,
            creators: vec![Subject::Wildcard],
            hmac_key_file: None,
            tags: BTreeMap::new(),
        }
    }

    /// Where the policy came from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the policy restricts anything (a policy file was given).
    pub fn is_enforcing(&self) -> bool {
        !self.users.is_empty()
            || !self.tables.is_empty()
            || !self.roles.is_empty()
            || !self.tags.is_empty()
    }

    /// The policy's users, sorted.
    pub fn user_names(&self) -> impl Iterator<Item = &str> {
        self.users.keys().map(String::as_str)
    }

    /// Whether `principal` is a user of the policy (always true for an open policy).
    pub fn is_known(&self, principal: &str) -> bool {
        !self.is_enforcing() || self.users.contains_key(principal)
    }

    /// Roles of a user.
    pub fn roles_of(&self, principal: &str) -> &[String] {
        self.users
            .get(principal)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// A user's attribute (`[users.NAME] attributes = { region = "EU" }`).
    pub fn attribute(&self, principal: &str, name: &str) -> Option<&str> {
        self.attributes
            .get(principal)?
            .get(name)
            .map(String::as_str)
    }

    /// `[masks] hmac_key_file` as written: where the `hmac_sha256` mask's secret is
    /// (relative: to the policy file's directory).
    pub fn hmac_key_file(&self) -> Option<&str> {
        self.hmac_key_file.as_deref()
    }

    /// Every `[areas.NAME]` of the policy.
    pub fn areas(&self) -> &[Area] {
        &self.areas
    }

    /// A table's policy, by `catalog.namespace.table`.
    pub fn table(&self, name: &str) -> Option<&TablePolicy> {
        self.tables.get(name)
    }

    /// Tables named by the policy.
    pub fn tables(&self) -> impl Iterator<Item = (&str, &TablePolicy)> {
        self.tables.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// `on_missing_key` for a column.
    pub fn on_missing_key(&self, table: &str, column: &str) -> MissingKey {
        self.column_policy(table, column)
            .and_then(|c| c.on_missing_key)
            .unwrap_or(self.on_missing_key)
    }

    /// Whether columns of `table` the policy denies are hidden instead
    /// (`hide_inaccessible_columns`, the table's own setting first).
    pub fn hides_inaccessible_columns(&self, table: &str) -> bool {
        self.tables
            .get(table)
            .and_then(|t| t.hide_inaccessible_columns)
            .unwrap_or(self.hide_inaccessible_columns)
    }

    /// The policy's tags.
    pub fn tags(&self) -> &BTreeMap<String, Tag> {
        &self.tags
    }
}
