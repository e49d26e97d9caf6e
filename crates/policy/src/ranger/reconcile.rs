//! Ranger's precedence against ClearIce's, for the users the policy knows: Ranger denies
//! when any deny matches and applies the first matching mask or row-filter item, where
//! ClearIce gives a user with several roles the most permissive role's rule. For each known
//! user, each imported table, column and row filter, Ranger's answer is computed from the
//! export and ClearIce's from the parsed policy itself; where ClearIce would give more, a
//! `user:NAME` rule with Ranger's answer is added.

use crate::Policy;
use crate::model::{Decision, TableDecision};

use super::translate::{Imported, Key};

/// A rule one user needs so that ClearIce is no more permissive than Ranger.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct UserFix {
    /// The user.
    pub user: String,
    /// The table, `catalog.namespace.table`.
    pub table: String,
    /// The rule.
    pub fix: Fix,
}

/// The rule of a [`UserFix`].
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Fix {
    /// `access = { "user:NAME" = "deny" }`.
    TableDeny,
    /// A column rule.
    Column(String, Decision),
    /// A row filter.
    RowFilter(String),
}

/// The user rules `policy` (the import so far) lacks.
pub(super) fn user_rules(policy: &Policy, imported: &Imported) -> Vec<UserFix> {
    let mut out = Vec::new();
    for user in policy.user_names() {
        let roles = policy.roles_of(user);
        let matches = |keys: &[Key]| {
            keys.iter().any(|k| {
                k == "*" || k.strip_prefix("user:") == Some(user) || roles.iter().any(|r| r == k)
            })
        };
        let fix = |table: &str, fix: Fix| UserFix {
            user: user.to_owned(),
            table: table.to_owned(),
            fix,
        };
        for (table, rules) in &imported.tables {
            let deny: Vec<Key> = rules.read_deny.iter().cloned().collect();
            let allow: Vec<Key> = rules.read_allow.iter().cloned().collect();
            let ranger_reads = !matches(&deny) && matches(&allow);
            if !ranger_reads && policy.table_access(user, table).0 == TableDecision::Allow {
                out.push(fix(table, Fix::TableDeny));
            }
            for (column, c) in &rules.columns {
                let deny: Vec<Key> = c.deny.iter().cloned().collect();
                let ranger = if matches(&deny) {
                    Decision::Deny
                } else {
                    c.masks
                        .iter()
                        .find(|(keys, _)| matches(keys))
                        .map_or(Decision::Plaintext, |(_, d)| d.clone())
                };
                let ours = policy.decide_as_written(user, table, column).decision;
                if ours != ranger && ours.rank() >= ranger.rank() {
                    out.push(fix(table, Fix::Column(column.clone(), ranger)));
                }
            }
            if rules.row_filters.is_empty() {
                continue;
            }
            // Ranger: the first matching item's filter, else every row.
            let Some((_, ranger)) = rules.row_filters.iter().find(|(keys, _)| matches(keys)) else {
                continue;
            };
            let ours = policy
                .row_filter(user, table)
                .map(|f| f.predicates)
                .unwrap_or_default();
            if ours != [ranger.as_str()] && ours != ["false"] {
                out.push(fix(table, Fix::RowFilter(ranger.clone())));
            }
        }
    }
    out
}

/// The fixes, one `user on table` per fix, for a note.
pub(super) fn describe(fixes: &[UserFix]) -> String {
    fixes
        .iter()
        .map(|f| match &f.fix {
            Fix::TableDeny => format!("{} denied {}", f.user, f.table),
            Fix::Column(c, d) => format!("{} {} on {}.{c}", f.user, d.name(), f.table),
            Fix::RowFilter(_) => format!("{} row filter on {}", f.user, f.table),
        })
        .collect::<Vec<_>>()
        .join("; ")
}
