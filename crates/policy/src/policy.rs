//! Policy file parsing, validation and evaluation.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use toml::Spanned;

use crate::error::{Error, Result};
use crate::model::{ColumnKind, Decision, Mask, MissingKey, Resolved, RuleSource, TableDecision};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    #[serde(default)]
    on_missing_key: Option<Spanned<String>>,
    #[serde(default)]
    users: BTreeMap<Spanned<String>, RawUser>,
    #[serde(default)]
    roles: BTreeMap<Spanned<String>, RawRole>,
    #[serde(default)]
    files: Option<RawFiles>,
    #[serde(default)]
    tables: BTreeMap<Spanned<String>, RawTable>,
    #[serde(default)]
    areas: BTreeMap<Spanned<String>, RawArea>,
    #[serde(default)]
    writes: Option<RawWrites>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWrites {
    #[serde(default)]
    create: Vec<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawArea {
    root: Spanned<String>,
    #[serde(default)]
    read: Vec<Spanned<String>>,
    #[serde(default)]
    write: Vec<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUser {
    #[serde(default)]
    roles: Vec<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRole {
    #[serde(default)]
    #[allow(dead_code)]
    description: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFiles {
    #[serde(default)]
    decrypt: Vec<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTable {
    #[serde(default)]
    footer_key: Option<String>,
    #[serde(default)]
    plaintext_footer: bool,
    #[serde(default)]
    aad_prefix: Option<String>,
    #[serde(default)]
    provider: Option<String>,
    #[serde(default)]
    access: BTreeMap<Spanned<String>, Spanned<String>>,
    #[serde(default)]
    write: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    export: Vec<Spanned<String>>,
    #[serde(default)]
    columns: BTreeMap<Spanned<String>, RawColumn>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawColumn {
    #[serde(default)]
    master_key: Option<String>,
    #[serde(default)]
    provider: Option<String>,
    #[serde(default)]
    on_missing_key: Option<Spanned<String>>,
    #[serde(default)]
    access: BTreeMap<Spanned<String>, Spanned<toml::Value>>,
    #[serde(default)]
    write: Vec<Spanned<String>>,
}

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
    roles: BTreeSet<String>,
    file_decrypt: Vec<Subject>,
    areas: Vec<Area>,
    tables: BTreeMap<String, TablePolicy>,
    on_missing_key: MissingKey,
    /// `[writes] create`: who may create and drop schemas and tables, and write tables
    /// without their own `write`.
    creators: Vec<Subject>,
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

fn parse_missing_key(
    v: &Spanned<String>,
    err: &impl Fn(usize, String) -> Error,
) -> Result<MissingKey> {
    match v.get_ref().as_str() {
        "error" => Ok(MissingKey::Error),
        "null" => Ok(MissingKey::Null),
        "fixed" => Ok(MissingKey::Fixed),
        "hide" => Ok(MissingKey::Hide),
        other => Err(err(
            v.span().start,
            format!("on_missing_key '{other}' is not one of error, null, fixed, hide"),
        )),
    }
}

/// Parses a decision name (`plaintext`, a mask name, `hide`, `deny`).
pub fn parse_decision(name: &str, fixed_value: Option<String>) -> Option<Decision> {
    Some(match name {
        "plaintext" => Decision::Plaintext,
        "null" => Decision::Mask(Mask::Null),
        "fixed" => Decision::Mask(Mask::Fixed(fixed_value)),
        "show_last_4" => Decision::Mask(Mask::ShowLast4),
        "show_first_4" => Decision::Mask(Mask::ShowFirst4),
        "sha256" => Decision::Mask(Mask::Sha256),
        "truncate_to_year" => Decision::Mask(Mask::TruncateToYear),
        "truncate_to_month" => Decision::Mask(Mask::TruncateToMonth),
        "hide" => Decision::Hide,
        "deny" => Decision::Deny,
        _ => return None,
    })
}

const DECISIONS: &str = "plaintext, null, fixed, show_last_4, show_first_4, sha256, truncate_to_year, truncate_to_month, hide, deny";

impl Policy {
    /// An empty policy: everyone sees plaintext (used when no policy file is configured).
    pub fn open(source: &str) -> Self {
        Self {
            source: source.into(),
            users: BTreeMap::new(),
            roles: BTreeSet::new(),
            file_decrypt: vec![Subject::Wildcard],
            areas: Vec::new(),
            tables: BTreeMap::new(),
            on_missing_key: MissingKey::Error,
            creators: vec![Subject::Wildcard],
        }
    }

    /// Parses and validates policy text. `source` names it in errors.
    pub fn parse(text: &str, source: &str) -> Result<Self> {
        let err = |offset: usize, message: String| Error::Invalid {
            source_name: source.into(),
            line: Some(line_of(text, offset)),
            message,
        };
        let raw: RawPolicy = toml::from_str(text).map_err(|e| Error::Invalid {
            source_name: source.into(),
            line: e.span().map(|s| line_of(text, s.start)),
            message: e.message().to_owned(),
        })?;
        let roles: BTreeSet<String> = raw.roles.keys().map(|k| k.get_ref().clone()).collect();
        let mut users = BTreeMap::new();
        for (name, u) in &raw.users {
            let mut rs = Vec::new();
            for r in &u.roles {
                if !roles.contains(r.get_ref()) {
                    return Err(err(
                        r.span().start,
                        format!(
                            "user '{}' has unknown role '{}'",
                            name.get_ref(),
                            r.get_ref()
                        ),
                    ));
                }
                rs.push(r.get_ref().clone());
            }
            users.insert(name.get_ref().clone(), rs);
        }
        let subject = |s: &Spanned<String>| -> Result<Subject> {
            let k = s.get_ref();
            if k == "*" {
                Ok(Subject::Wildcard)
            } else if let Some(u) = k.strip_prefix("user:") {
                if users.contains_key(u) {
                    Ok(Subject::User(u.to_owned()))
                } else {
                    Err(err(
                        s.span().start,
                        format!("unknown principal '{u}' (not in [users])"),
                    ))
                }
            } else if roles.contains(k) {
                Ok(Subject::Role(k.clone()))
            } else {
                Err(err(
                    s.span().start,
                    format!("unknown role '{k}' (declare it in [roles], or write user:NAME or *)"),
                ))
            }
        };
        let file_decrypt = match &raw.files {
            Some(f) => f.decrypt.iter().map(&subject).collect::<Result<_>>()?,
            None => Vec::new(),
        };
        let mut areas = Vec::new();
        for (name, a) in &raw.areas {
            let root = a.root.get_ref();
            if root.is_empty() || root.contains("://") {
                return Err(err(
                    a.root.span().start,
                    format!(
                        "area '{}': root '{root}' must be a local directory (object-store areas are not supported yet)",
                        name.get_ref()
                    ),
                ));
            }
            areas.push(Area {
                name: name.get_ref().clone(),
                root: root.clone(),
                read: a.read.iter().map(&subject).collect::<Result<_>>()?,
                write: a.write.iter().map(&subject).collect::<Result<_>>()?,
            });
        }
        let on_missing_key = match &raw.on_missing_key {
            Some(v) => parse_missing_key(v, &err)?,
            None => MissingKey::Error,
        };
        let mut tables = BTreeMap::new();
        for (tname, t) in &raw.tables {
            // catalog.namespace.table, the namespace of any depth (`cat.a.b.t`).
            if tname.get_ref().split('.').count() < 3
                || tname.get_ref().split('.').any(str::is_empty)
            {
                return Err(err(
                    tname.span().start,
                    format!(
                        "table '{}' must be written catalog.namespace.table",
                        tname.get_ref()
                    ),
                ));
            }
            let mut access = Vec::new();
            for (k, v) in &t.access {
                let d = TableDecision::parse(v.get_ref()).ok_or_else(|| {
                    err(
                        v.span().start,
                        format!(
                            "'{}' is not a table decision (expected one of allow, deny, hide)",
                            v.get_ref()
                        ),
                    )
                })?;
                access.push((subject(k)?, d));
            }
            let mut columns = BTreeMap::new();
            for (cname, c) in &t.columns {
                let mut rules = Vec::new();
                for (k, v) in &c.access {
                    let s = subject(k)?;
                    let d = match v.get_ref() {
                        toml::Value::String(name) => parse_decision(name, None),
                        toml::Value::Table(tbl) => {
                            let unknown: Vec<_> = tbl
                                .keys()
                                .filter(|k| *k != "mask" && *k != "value")
                                .collect();
                            if let Some(u) = unknown.first() {
                                return Err(err(
                                    v.span().start,
                                    format!("unknown key '{u}' in rule (expected mask, value)"),
                                ));
                            }
                            let value = tbl.get("value").map(|v| match v {
                                toml::Value::String(s) => s.clone(),
                                other => other.to_string(),
                            });
                            tbl.get("mask")
                                .and_then(toml::Value::as_str)
                                .and_then(|m| parse_decision(m, value))
                        }
                        _ => None,
                    };
                    let d = d.ok_or_else(|| {
                        err(
                            v.span().start,
                            format!(
                                "'{}' is not a decision (expected one of {DECISIONS})",
                                match v.get_ref() {
                                    toml::Value::String(s) => s.clone(),
                                    other => other.to_string(),
                                }
                            ),
                        )
                    })?;
                    rules.push((s, d));
                }
                let on_missing_key = c
                    .on_missing_key
                    .as_ref()
                    .map(|v| parse_missing_key(v, &err))
                    .transpose()?;
                columns.insert(
                    cname.get_ref().clone(),
                    ColumnPolicy {
                        master_key: c.master_key.clone(),
                        provider: c.provider.clone(),
                        on_missing_key,
                        rules,
                        write: c.write.iter().map(&subject).collect::<Result<_>>()?,
                    },
                );
            }
            tables.insert(
                tname.get_ref().clone(),
                TablePolicy {
                    footer_key: t.footer_key.clone(),
                    plaintext_footer: t.plaintext_footer,
                    aad_prefix: t.aad_prefix.clone(),
                    provider: t.provider.clone(),
                    access,
                    write: t
                        .write
                        .as_ref()
                        .map(|w| w.iter().map(&subject).collect::<Result<_>>())
                        .transpose()?,
                    export: t.export.iter().map(&subject).collect::<Result<_>>()?,
                    columns,
                },
            );
        }
        let creators = match &raw.writes {
            Some(w) => w.create.iter().map(&subject).collect::<Result<_>>()?,
            None => Vec::new(),
        };
        Ok(Self {
            source: source.into(),
            users,
            roles,
            file_decrypt,
            areas,
            tables,
            on_missing_key,
            creators,
        })
    }

    /// Where the policy came from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the policy restricts anything (a policy file was given).
    pub fn is_enforcing(&self) -> bool {
        !self.users.is_empty() || !self.tables.is_empty() || !self.roles.is_empty()
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

    /// Whether `principal` may decrypt standalone files (not in a catalog), per `[files]`.
    pub fn may_decrypt_files(&self, principal: &str) -> bool {
        self.file_decrypt.iter().any(|s| self.matches(s, principal))
    }

    /// Every `[areas.NAME]` of the policy.
    pub fn areas(&self) -> &[Area] {
        &self.areas
    }

    /// Whether `principal` may read files by path under `area`.
    pub fn may_read_area(&self, area: &Area, principal: &str) -> bool {
        area.read.iter().any(|s| self.matches(s, principal))
    }

    /// Whether `principal` may export (`COPY ... TO`) under `area`.
    pub fn may_write_area(&self, area: &Area, principal: &str) -> bool {
        area.write.iter().any(|s| self.matches(s, principal))
    }

    fn matches(&self, s: &Subject, principal: &str) -> bool {
        match s {
            Subject::Wildcard => self.is_known(principal),
            Subject::User(u) => u == principal,
            Subject::Role(r) => self.roles_of(principal).contains(r),
        }
    }

    /// Whether `principal` may create and drop schemas and tables (`[writes] create`;
    /// everyone under an open policy).
    pub fn may_create(&self, principal: &str) -> bool {
        self.creators.iter().any(|s| self.matches(s, principal))
    }

    /// Whether `principal` may change `table`'s rows or definition: the table's `write`,
    /// else `[writes] create` (everyone under an open policy).
    pub fn may_write_table(&self, principal: &str, table: &str) -> bool {
        match self.tables.get(table).and_then(|t| t.write.as_ref()) {
            Some(w) => w.iter().any(|s| self.matches(s, principal)),
            None => self.may_create(principal),
        }
    }

    /// Whether `principal` may write values into `table.column`: a protected column
    /// (`master_key`) needs the column's `write`; others follow the table. Under an
    /// open policy, everyone.
    pub fn may_write_column(&self, principal: &str, table: &str, column: &str) -> bool {
        if !self.is_enforcing() {
            return true;
        }
        match self.tables.get(table).and_then(|t| t.columns.get(column)) {
            Some(c) if c.master_key.is_some() => c.write.iter().any(|s| self.matches(s, principal)),
            _ => true,
        }
    }

    /// Whether `principal` may export `table`'s protected columns decrypted (`export`;
    /// everyone under an open policy).
    pub fn may_export(&self, principal: &str, table: &str) -> bool {
        if !self.is_enforcing() {
            return true;
        }
        self.tables
            .get(table)
            .is_some_and(|t| t.export.iter().any(|s| self.matches(s, principal)))
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
        self.tables
            .get(table)
            .and_then(|t| t.columns.get(column))
            .and_then(|c| c.on_missing_key)
            .unwrap_or(self.on_missing_key)
    }

    /// The rule for `principal` among `rules`: a `user:` rule, else the most permissive
    /// of the principal's roles, else `*`.
    fn pick<D: Clone>(
        &self,
        principal: &str,
        rules: &[(Subject, D)],
        rank: impl Fn(&D) -> u8,
    ) -> Option<(D, RuleSource)> {
        if let Some((_, d)) = rules
            .iter()
            .find(|(s, _)| matches!(s, Subject::User(u) if u == principal))
        {
            return Some((d.clone(), RuleSource::User(principal.to_owned())));
        }
        let roles = self.roles_of(principal);
        let best = rules
            .iter()
            .filter_map(|(s, d)| match s {
                Subject::Role(r) if roles.contains(r) => Some((r, d)),
                _ => None,
            })
            .max_by_key(|(_, d)| rank(d));
        if let Some((r, d)) = best {
            return Some((d.clone(), RuleSource::Role(r.clone())));
        }
        rules
            .iter()
            .find(|(s, _)| *s == Subject::Wildcard)
            .map(|(_, d)| (d.clone(), RuleSource::Wildcard))
    }

    /// Whether `principal` may read `table` at all. Rules as for columns; no matching
    /// rule allows the table; a principal the policy does not know is denied.
    pub fn table_access(&self, principal: &str, table: &str) -> (TableDecision, RuleSource) {
        if !self.is_known(principal) {
            return (TableDecision::Deny, RuleSource::UnknownPrincipal);
        }
        self.tables
            .get(table)
            .and_then(|t| self.pick(principal, &t.access, |d| d.rank()))
            .unwrap_or((TableDecision::Allow, RuleSource::DefaultUnprotected))
    }

    /// What `principal` sees of `table.column`. Most specific rule wins (user over role
    /// over `*`); among a user's roles the most permissive decision wins; a protected
    /// column with no matching rule is denied, an unprotected one is plaintext.
    pub fn decide(&self, principal: &str, table: &str, column: &str) -> Resolved {
        if !self.is_known(principal) {
            return Resolved {
                decision: Decision::Deny,
                rule: RuleSource::UnknownPrincipal,
            };
        }
        let col = self.tables.get(table).and_then(|t| t.columns.get(column));
        let Some(col) = col else {
            return Resolved {
                decision: Decision::Plaintext,
                rule: RuleSource::DefaultUnprotected,
            };
        };
        if let Some((decision, rule)) = self.pick(principal, &col.rules, Decision::rank) {
            return Resolved { decision, rule };
        }
        if col.master_key.is_some() {
            Resolved {
                decision: Decision::Deny,
                rule: RuleSource::DefaultProtected,
            }
        } else {
            Resolved {
                decision: Decision::Plaintext,
                rule: RuleSource::DefaultUnprotected,
            }
        }
    }

    /// Checks the policy against a table's columns (`clearice policy check`): every
    /// named column exists and every mask applies to its column's kind.
    pub fn check_table(&self, table: &str, columns: &[(String, ColumnKind)]) -> Vec<Error> {
        let mut out = Vec::new();
        let Some(t) = self.tables.get(table) else {
            return out;
        };
        let bad = |message: String| Error::Catalog {
            source_name: self.source.clone(),
            message,
        };
        for (name, c) in &t.columns {
            let Some((_, kind)) = columns.iter().find(|(n, _)| n == name) else {
                out.push(bad(format!("table '{table}' has no column '{name}'")));
                continue;
            };
            for (s, d) in &c.rules {
                if let Decision::Mask(m) = d
                    && !m.applies_to(*kind)
                {
                    out.push(bad(format!(
                        "{table}.{name}: mask '{}' (for {}) does not apply to a {kind:?} column",
                        m.name(),
                        match s {
                            Subject::User(u) => format!("user:{u}"),
                            Subject::Role(r) => format!("role {r}"),
                            Subject::Wildcard => "*".into(),
                        }
                    )));
                }
            }
        }
        out
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests may block")]
mod tests {
    use super::*;

    const P: &str = r#"
[users]
alice = { roles = ["analyst"] }
bob = { roles = ["analyst", "support"] }
root = { roles = ["admin"] }

[roles]
admin = {}
analyst = {}
support = {}

[tables."lake.sales.customers".columns.ssn]
master_key = "pii_key"
access = { admin = "plaintext", analyst = "show_last_4", support = "null", "user:alice" = "sha256" }

[tables."lake.sales.customers".columns.email]
master_key = "pii_key"
access = { support = "plaintext" }

[tables."lake.sales.customers".columns.country]
access = { "*" = "hide", admin = "plaintext" }
"#;

    fn p() -> Policy {
        Policy::parse(P, "p.toml").unwrap()
    }

    #[test]
    fn user_rule_beats_role_rule() {
        assert_eq!(
            p().decide("alice", "lake.sales.customers", "ssn").decision,
            Decision::Mask(Mask::Sha256)
        );
    }

    #[test]
    fn most_permissive_role_wins() {
        let r = p().decide("bob", "lake.sales.customers", "ssn");
        assert_eq!(r.decision, Decision::Mask(Mask::ShowLast4));
        assert_eq!(r.rule, RuleSource::Role("analyst".into()));
    }

    #[test]
    fn protected_column_without_matching_rule_is_denied() {
        let r = p().decide("alice", "lake.sales.customers", "email");
        assert_eq!(
            (r.decision, r.rule),
            (Decision::Deny, RuleSource::DefaultProtected)
        );
    }

    #[test]
    fn unprotected_column_is_plaintext_and_wildcard_applies() {
        assert_eq!(
            p().decide("alice", "lake.sales.customers", "name").decision,
            Decision::Plaintext
        );
        assert_eq!(
            p().decide("alice", "lake.sales.customers", "country")
                .decision,
            Decision::Hide
        );
        assert_eq!(
            p().decide("root", "lake.sales.customers", "country")
                .decision,
            Decision::Plaintext
        );
    }

    #[test]
    fn unknown_principal_is_denied() {
        let r = p().decide("mallory", "lake.sales.customers", "name");
        assert_eq!(
            (r.decision, r.rule),
            (Decision::Deny, RuleSource::UnknownPrincipal)
        );
    }

    #[test]
    fn unknown_mask_is_reported_with_its_line() {
        let bad = P.replace("\"show_last_4\"", "\"show_last_5\"");
        let e = Policy::parse(&bad, "p.toml").unwrap_err().to_string();
        assert!(
            e.contains("p.toml' line 14") && e.contains("show_last_5"),
            "{e}"
        );
    }

    #[test]
    fn unknown_role_and_user_are_reported() {
        let e = Policy::parse(
            &P.replace("support = \"null\"", "intern = \"null\""),
            "p.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("unknown role 'intern'") && e.contains("line 14"),
            "{e}"
        );
        let e = Policy::parse(&P.replace("user:alice", "user:eve"), "p.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown principal 'eve'"), "{e}");
        let e = Policy::parse(
            &P.replace("roles = [\"admin\"]", "roles = [\"boss\"]"),
            "p.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("unknown role 'boss'") && e.contains("line 5"),
            "{e}"
        );
    }

    #[test]
    fn unknown_key_is_reported() {
        let e = Policy::parse("[users]\nx = { role = [] }\n", "p.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2") && e.contains("role"), "{e}");
    }

    #[test]
    fn check_table_flags_missing_columns_and_type_mismatches() {
        let errs = p().check_table(
            "lake.sales.customers",
            &[
                ("ssn".into(), ColumnKind::Date),
                ("country".into(), ColumnKind::String),
            ],
        );
        let text = format!("{errs:?}");
        assert!(
            text.contains("no column 'email'") && text.contains("show_last_4"),
            "{text}"
        );
    }

    #[test]
    fn tables_in_nested_namespaces_are_nameable() {
        let t = format!(
            "{P}\n[tables.\"lake.deep.er.t\".columns.ssn]\nmaster_key = \"k\"\naccess = {{ admin = \"plaintext\" }}\n"
        );
        let p = Policy::parse(&t, "p").unwrap();
        assert_eq!(
            p.decide("root", "lake.deep.er.t", "ssn").decision,
            Decision::Plaintext
        );
        assert_eq!(
            p.decide("alice", "lake.deep.er.t", "ssn").decision,
            Decision::Deny
        );
        for bad in ["lake.t", "lake..t", "lake.a."] {
            let t = format!("{P}\n[tables.\"{bad}\".columns.ssn]\nmaster_key = \"k\"\n");
            assert!(Policy::parse(&t, "p").is_err(), "{bad}");
        }
    }

    #[test]
    fn table_access_rules() {
        let t = format!(
            "{P}\n[tables.\"lake.sales.payroll\"]\naccess = {{ \"*\" = \"hide\", analyst = \"deny\", admin = \"allow\" }}\n"
        );
        let p = Policy::parse(&t, "p").unwrap();
        let d = |u: &str| p.table_access(u, "lake.sales.payroll");
        assert_eq!(
            d("root"),
            (TableDecision::Allow, RuleSource::Role("admin".into()))
        );
        assert_eq!(
            d("alice"),
            (TableDecision::Deny, RuleSource::Role("analyst".into()))
        );
        // bob is analyst and support: the most permissive of his roles (deny) wins over `*`.
        assert_eq!(d("bob").0, TableDecision::Deny);
        assert_eq!(
            d("mallory"),
            (TableDecision::Deny, RuleSource::UnknownPrincipal)
        );
        // A table without rules is allowed.
        assert_eq!(
            p.table_access("alice", "lake.sales.customers").0,
            TableDecision::Allow
        );
        let e = Policy::parse(&t.replace("\"deny\"", "\"nope\""), "p")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("'nope' is not a table decision") && e.contains("line 24"),
            "{e}"
        );
    }

    #[test]
    fn fixed_mask_takes_a_value() {
        let t = "[roles]\nr = {}\n[users]\nu = { roles = [\"r\"] }\n[tables.\"a.b.c\".columns.x]\naccess = { r = { mask = \"fixed\", value = 42 } }\n";
        let p = Policy::parse(t, "p").unwrap();
        assert_eq!(
            p.decide("u", "a.b.c", "x").decision,
            Decision::Mask(Mask::Fixed(Some("42".into())))
        );
    }
}

#[cfg(test)]
mod write_tests {
    use super::*;

    const P: &str = r#"
[roles]
etl = {}
analyst = {}
[users]
ann = { roles = ["analyst"] }
eve = { roles = ["etl"] }
root = { roles = ["etl", "analyst"] }

[writes]
create = ["etl"]

[tables."c.n.t"]
write = ["etl", "user:ann"]
export = ["user:root"]

[tables."c.n.t".columns.ssn]
master_key = "k"
write = ["user:root"]

[tables."c.n.t".columns.secret]
master_key = "k"

[tables."c.n.listed_only".columns.x]
access = { "*" = "plaintext" }
"#;

    #[test]
    fn write_rules_default_to_create_and_protected_columns_to_nobody() {
        let p = Policy::parse(P, "p").unwrap();
        // [writes] create: schemas and tables, and tables without their own `write`
        assert!(p.may_create("eve") && !p.may_create("ann"));
        assert!(p.may_write_table("eve", "c.n.listed_only"));
        assert!(p.may_write_table("eve", "c.n.unlisted"));
        assert!(!p.may_write_table("ann", "c.n.unlisted"));
        // a table's own `write` replaces the default
        assert!(p.may_write_table("ann", "c.n.t") && p.may_write_table("eve", "c.n.t"));
        // protected columns: their own `write` list only (none: nobody)
        assert!(p.may_write_column("root", "c.n.t", "ssn"));
        assert!(!p.may_write_column("eve", "c.n.t", "ssn"));
        assert!(!p.may_write_column("root", "c.n.t", "secret"));
        // unprotected columns follow the table
        assert!(p.may_write_column("ann", "c.n.t", "name"));
        // export: the table's list only
        assert!(p.may_export("root", "c.n.t") && !p.may_export("eve", "c.n.t"));
        assert!(!p.may_export("root", "c.n.unlisted"));
        // unknown principals may do nothing
        assert!(!p.may_create("mallory") && !p.may_write_table("mallory", "c.n.t"));
    }

    #[test]
    fn an_open_policy_lets_everyone_write_and_an_unknown_subject_is_an_error() {
        let open = Policy::open("none");
        assert!(open.may_create("anyone"));
        assert!(open.may_write_table("anyone", "c.n.t"));
        assert!(open.may_write_column("anyone", "c.n.t", "ssn"));
        assert!(open.may_export("anyone", "c.n.t"));
        let e = Policy::parse(&P.replace("\"user:ann\"]", "\"user:zed\"]"), "p")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown principal 'zed'"), "{e}");
    }
}

#[cfg(test)]
mod area_tests {
    use super::*;

    const P: &str = r#"
[users]
ann = { roles = ["analyst"] }
sam = { roles = ["support"] }
[roles]
analyst = {}
support = {}
[areas.exports]
root = "/srv/exports"
read = ["analyst"]
write = ["analyst", "user:sam"]
"#;

    #[test]
    fn area_grants_follow_roles_and_users() {
        let p = Policy::parse(P, "p.toml").unwrap();
        let a = &p.areas()[0];
        assert_eq!(
            (a.name.as_str(), a.root.as_str()),
            ("exports", "/srv/exports")
        );
        assert!(p.may_read_area(a, "ann"));
        assert!(!p.may_read_area(a, "sam"));
        assert!(p.may_write_area(a, "sam"));
        assert!(!p.may_write_area(a, "stranger"));
    }

    #[test]
    fn area_with_url_root_or_unknown_role_is_refused_with_its_line() {
        let e = Policy::parse(&P.replace("/srv/exports", "s3://b/x"), "p.toml").unwrap_err();
        assert!(
            e.to_string().contains("line 9") && e.to_string().contains("object-store"),
            "{e}"
        );
        let e = Policy::parse(&P.replace("\"user:sam\"", "\"nobody\""), "p.toml").unwrap_err();
        assert!(e.to_string().contains("unknown role 'nobody'"), "{e}");
    }
}
