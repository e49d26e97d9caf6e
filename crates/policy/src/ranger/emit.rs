//! The imported rules written into policy text, merged into a base policy with its comments
//! and layout kept: for each table the export names, the export decides the table's
//! `access`, `write` and (if it filters) `row_filter`, and the `access` of each column it
//! masks or denies; the base's other settings (keys, providers, other columns) stay.

use std::collections::BTreeMap;

use toml_edit::{Array, DocumentMut, InlineTable, Item, Table, Value};

use crate::Policy;
use crate::error::{Error, Result};
use crate::model::{Decision, Mask};

use super::reconcile::{Fix, UserFix};
use super::translate::{Imported, Key, TableRules};

/// The policy text being written.
pub(super) struct Document<'a> {
    doc: DocumentMut,
    base: Option<&'a Policy>,
}

impl<'a> Document<'a> {
    /// The base policy's text (already validated as `base`), or an empty one.
    pub fn new(
        text: Option<&str>,
        base: Option<&'a Policy>,
        bad: &dyn Fn(String) -> Error,
    ) -> Result<Self> {
        let doc = match text {
            Some(t) => t
                .parse::<DocumentMut>()
                .map_err(|e| bad(format!("the base policy: {e}")))?,
            None => DocumentMut::new(),
        };
        Ok(Self { doc, base })
    }

    /// The text so far.
    pub fn text(&self) -> String {
        self.doc.to_string()
    }

    /// Writes the imported users, roles and tables; returns notes on what of the base it
    /// replaced.
    pub fn merge(&mut self, imported: &Imported) -> Vec<String> {
        let mut notes = Vec::new();
        let root = self.doc.as_table_mut();
        let roles = subtable(root, "roles", false);
        for r in &imported.roles {
            if !roles.contains_key(r) {
                roles.insert(r, toml_edit::value(InlineTable::new()));
            }
        }
        let users = subtable(root, "users", false);
        let mut added = Vec::new();
        for u in &imported.users {
            if !users.contains_key(u) {
                let mut user = InlineTable::new();
                user.insert("roles", Value::Array(Array::new()));
                users.insert(u, toml_edit::value(user));
                added.push(u.as_str());
            }
        }
        if !added.is_empty() {
            notes.push(format!(
                "users {} were added without roles: a Ranger export holds no group \
                 memberships; give them their roles in [users] and run the import again \
                 with it as --base (a user: rule beats role rules, so only the import can \
                 reconcile them)",
                added.join(", ")
            ));
        }
        let base = self.base;
        let tables = subtable(root, "tables", true);
        for (name, rules) in &imported.tables {
            let table = subtable(tables, name, false);
            let replaced: Vec<&str> = ["access", "write", "row_filter"]
                .into_iter()
                .filter(|k| table.contains_key(k))
                .filter(|k| *k != "row_filter" || !rules.row_filters.is_empty())
                .collect();
            if !replaced.is_empty() {
                notes.push(format!(
                    "{name}: the base's {} replaced by the export's",
                    replaced.join(", ")
                ));
            }
            table.insert("access", toml_edit::value(inline(&table_access(rules))));
            let (writers, dropped) = writers(rules, base);
            if dropped {
                notes.push(format!(
                    "{name}: someone is denied changing it, which ClearIce's write list \
                     cannot express beside a role's grant: only users granted by name keep \
                     write (stricter)"
                ));
            }
            table.insert(
                "write",
                toml_edit::value(Value::Array(writers.iter().collect())),
            );
            if !rules.row_filters.is_empty() {
                let filters = first_per_key(&rules.row_filters);
                let t = subtable(table, "row_filter", false);
                t.clear();
                for (k, f) in filters {
                    t.insert(&k, toml_edit::value(f));
                }
            }
            for (column, c) in &rules.columns {
                let mut rules: BTreeMap<Key, Decision> = first_per_key(&c.masks);
                for k in &c.deny {
                    rules.insert(k.clone(), Decision::Deny);
                }
                if c.deny.contains("*") {
                    rules.values_mut().for_each(|d| *d = Decision::Deny);
                }
                let columns = subtable(table, "columns", true);
                let col = subtable(columns, column, false);
                if col.contains_key("access") {
                    notes.push(format!(
                        "{name}.{column}: the base's access replaced by the export's"
                    ));
                }
                let values: BTreeMap<Key, Value> = rules
                    .into_iter()
                    .map(|(k, d)| (k, decision_value(&d)))
                    .collect();
                col.insert("access", toml_edit::value(inline_values(values)));
            }
        }
        notes
    }

    /// Adds `user:NAME` rules the reconciliation found missing.
    pub fn add_user_rules(&mut self, fixes: &[UserFix]) {
        let tables = subtable(self.doc.as_table_mut(), "tables", true);
        for f in fixes {
            let key = format!("user:{}", f.user);
            let table = subtable(tables, &f.table, false);
            match &f.fix {
                Fix::TableDeny => set(table, "access", &key, Value::from("deny")),
                Fix::Column(column, d) => {
                    let columns = subtable(table, "columns", true);
                    let col = subtable(columns, column, false);
                    set(col, "access", &key, decision_value(d));
                }
                Fix::RowFilter(expr) => {
                    subtable(table, "row_filter", false).insert(&key, toml_edit::value(expr));
                }
            }
        }
    }
}

/// The table's ClearIce access: Ranger denies a table nobody is granted, and a deny wins
/// over every grant (a denied role's members with another granting role are the
/// reconciliation's).
fn table_access(r: &TableRules) -> BTreeMap<Key, &'static str> {
    let all_denied = r.read_deny.contains("*");
    let mut m = BTreeMap::new();
    let star = r.read_allow.contains("*") && !all_denied;
    m.insert("*".to_owned(), if star { "allow" } else { "deny" });
    for k in &r.read_allow {
        let denied = all_denied || r.read_deny.contains(k);
        m.insert(k.clone(), if denied { "deny" } else { "allow" });
    }
    for k in &r.read_deny {
        m.insert(k.clone(), "deny");
    }
    m
}

/// The table's write list, and whether grants to roles or everyone were dropped because
/// someone is denied (a list cannot say "but not them"). A user granted by name who is,
/// per the base, a member of a denied role is left out too.
fn writers(r: &TableRules, base: Option<&Policy>) -> (Vec<String>, bool) {
    // Any deny (a user's too: a member of a granted role) leaves only users granted by
    // name, since a list cannot say "but not them".
    let group_denied = !r.write_deny.is_empty();
    let member_of_denied = |user: &str| {
        r.write_deny.contains("*")
            || base.is_some_and(|p| {
                p.roles_of(user)
                    .iter()
                    .any(|role| r.write_deny.contains(role))
            })
    };
    let mut dropped = false;
    let list = r
        .write_allow
        .iter()
        .filter(|k| !r.write_deny.contains(*k))
        .filter(|k| match k.strip_prefix("user:") {
            Some(u) => !member_of_denied(u),
            None if group_denied => {
                dropped = true;
                false
            }
            None => true,
        })
        .cloned()
        .collect();
    (list, dropped)
}

/// The first value per key of items in Ranger's order.
fn first_per_key<V: Clone>(items: &[(Vec<Key>, V)]) -> BTreeMap<Key, V> {
    let mut out = BTreeMap::new();
    for (keys, v) in items {
        for k in keys {
            out.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    out
}

fn decision_value(d: &Decision) -> Value {
    match d {
        Decision::Mask(Mask::Fixed(Some(v))) => {
            let mut t = InlineTable::new();
            t.insert("mask", Value::from("fixed"));
            t.insert("value", Value::from(v.as_str()));
            Value::InlineTable(t)
        }
        d => Value::from(d.name()),
    }
}

fn inline(rules: &BTreeMap<Key, &'static str>) -> InlineTable {
    inline_values(
        rules
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(*v)))
            .collect(),
    )
}

fn inline_values(rules: BTreeMap<Key, Value>) -> InlineTable {
    let mut t = InlineTable::new();
    for (k, v) in rules {
        t.insert(k, v);
    }
    t
}

/// Sets `parent.key.subject = value` whether `key` is an inline table or a table.
fn set(parent: &mut Table, key: &str, subject: &str, value: Value) {
    match parent.get_mut(key) {
        Some(Item::Value(Value::InlineTable(t))) => {
            t.insert(subject, value);
        }
        Some(Item::Table(t)) => {
            t.insert(subject, toml_edit::value(value));
        }
        _ => {
            let mut t = InlineTable::new();
            t.insert(subject, value);
            parent.insert(key, toml_edit::value(t));
        }
    }
}

/// `parent.key` as a table (an inline table is turned into one; anything else replaced),
/// created if absent; `implicit`: no header of its own when it holds only tables.
fn subtable<'t>(parent: &'t mut Table, key: &str, implicit: bool) -> &'t mut Table {
    let item = parent.entry(key).or_insert_with(|| {
        let mut t = Table::new();
        t.set_implicit(implicit);
        Item::Table(t)
    });
    if let Item::Value(Value::InlineTable(t)) = item {
        *item = Item::Table(std::mem::take(t).into_table());
    }
    if !item.is_table() {
        let mut t = Table::new();
        t.set_implicit(implicit);
        *item = Item::Table(t);
    }
    item.as_table_mut().expect("made a table above")
}
