//! Tags: a column classified `pii` (by a `[tags.pii] columns` pattern, or by its own
//! `tags = ["pii"]`) is protected and decided by the tag wherever it appears, tables
//! created after the policy was written included. A column's own rule for a principal wins;
//! else the strictest of its tags' decisions (a tag with no rule for the principal denies);
//! its master key is its own, else its tags' (tags naming different keys deny the column to
//! everyone).

use std::borrow::Cow;

use super::{ColumnPolicy, Policy, Subject, TablePolicy};

/// Whether `pattern` (`catalog.namespace.table.column`, `*` for any one part; or a bare
/// column name) matches `column` of `table` (`catalog.namespace.table`).
pub fn pattern_matches(pattern: &str, table: &str, column: &str) -> bool {
    let Some((table_pattern, column_pattern)) = pattern.rsplit_once('.') else {
        return pattern == column;
    };
    if column_pattern != "*" && column_pattern != column {
        return false;
    }
    let want: Vec<&str> = table_pattern.split('.').collect();
    let have: Vec<&str> = table.split('.').collect();
    want.len() == have.len() && want.iter().zip(&have).all(|(w, h)| *w == "*" || w == h)
}

impl Policy {
    /// The tags of `table.column`: those it names, then those whose patterns match it.
    fn tags_of<'a>(&'a self, explicit: &'a [String], table: &str, column: &str) -> Vec<&'a str> {
        let mut out: Vec<&str> = explicit.iter().map(String::as_str).collect();
        for (name, tag) in &self.tags {
            if !out.contains(&name.as_str())
                && tag
                    .columns
                    .iter()
                    .any(|p| pattern_matches(p, table, column))
            {
                out.push(name);
            }
        }
        out
    }

    /// `table.column`'s policy, its tags resolved (`None`: neither the table nor a tag
    /// says anything of it).
    pub fn column_policy(&self, table: &str, column: &str) -> Option<Cow<'_, ColumnPolicy>> {
        let own = self.tables.get(table).and_then(|t| t.columns.get(column));
        let tags = self.tags_of(own.map_or(&[][..], |c| &c.tags), table, column);
        if tags.is_empty() {
            return own.map(Cow::Borrowed);
        }
        let mut c = own.cloned().unwrap_or_default();
        let mut keys: Vec<&str> = Vec::new();
        let mut writers: Option<Vec<Subject>> = None;
        for name in &tags {
            let Some(tag) = self.tags.get(*name) else {
                continue;
            };
            c.tag_rules.push(((*name).to_owned(), tag.rules.clone()));
            if let Some(k) = &tag.master_key {
                if !keys.contains(&k.as_str()) {
                    keys.push(k);
                }
                if c.provider.is_none() {
                    c.provider.clone_from(&tag.provider);
                }
                // Writers of a column under several keyed tags: those every tag allows.
                writers = Some(match writers {
                    None => tag.write.clone(),
                    Some(w) => w.into_iter().filter(|s| tag.write.contains(s)).collect(),
                });
            }
        }
        if c.master_key.is_none() {
            match keys.as_slice() {
                [] => {}
                [k] => c.master_key = Some((*k).to_owned()),
                _ => {
                    c.key_conflict = Some(format!(
                        "its tags {} declare different master keys ({})",
                        tags.join(", "),
                        keys.join(", ")
                    ));
                }
            }
            if c.write.is_empty() {
                c.write = writers.unwrap_or_default();
            }
        }
        Some(Cow::Owned(c))
    }

    /// `table`'s policy with the tags of `columns` (its columns, by current name)
    /// resolved into its column policies (`None`: the policy says nothing of the table).
    pub fn table_policy<'c>(
        &self,
        table: &str,
        columns: impl IntoIterator<Item = &'c str>,
    ) -> Option<Cow<'_, TablePolicy>> {
        let own = self.tables.get(table);
        if self.tags.is_empty() {
            return own.map(Cow::Borrowed);
        }
        let mut resolved: Option<TablePolicy> = None;
        for column in columns {
            if let Some(Cow::Owned(c)) = self.column_policy(table, column) {
                resolved
                    .get_or_insert_with(|| own.cloned().unwrap_or_default())
                    .columns
                    .insert(column.to_owned(), c);
            }
        }
        let mut t = match resolved {
            Some(t) => t,
            None => return own.map(Cow::Borrowed),
        };
        // PME needs a footer key: a table without one takes that of the first tag (by
        // name) encrypting one of its columns.
        if t.footer_key.is_none() {
            let names: std::collections::BTreeSet<&String> = t
                .columns
                .values()
                .flat_map(|c| c.tag_rules.iter().map(|(n, _)| n))
                .collect();
            t.footer_key = names
                .into_iter()
                .filter_map(|n| self.tags.get(n))
                .find_map(|tag| tag.footer_key.clone().or_else(|| tag.master_key.clone()));
        }
        Some(Cow::Owned(t))
    }
}

#[cfg(test)]
mod tests {
    use super::pattern_matches;
    use crate::Policy;
    use crate::model::{Decision, Mask, RuleSource};

    const P: &str = r#"
[roles]
analyst = {}
admin = {}
support = {}
[users]
ann = { roles = ["analyst"] }
root = { roles = ["admin"] }
sam = { roles = ["support"] }
nobody = { roles = [] }
[tags.pii]
columns = ["*.*.*.email", "ssn"]
master_key = "pii_key"
access = { admin = "plaintext", analyst = "sha256", support = "show_last_4" }
write = ["admin"]
[tags.finance]
columns = ["lake.sales.*.balance"]
master_key = "finance_key"
access = { admin = "plaintext", analyst = "plaintext" }
[tags.contact]
access = { "*" = "null", support = "plaintext" }
[tables."lake.sales.customers".columns.ssn]
access = { "user:ann" = "plaintext" }
[tables."lake.sales.customers".columns.phone]
tags = ["contact", "pii"]
[tables."lake.sales.customers".columns.mixed]
tags = ["pii", "finance"]
"#;

    #[test]
    fn a_tagged_column_is_decided_by_its_tags_wherever_it_appears() {
        let p = Policy::parse(P, "p.toml").unwrap();
        let d = |u: &str, t: &str, c: &str| p.decide(u, t, c).decision;
        // A table the policy does not name, created later: the pattern still applies.
        assert_eq!(
            d("ann", "lake.new.t", "email"),
            Decision::Mask(Mask::Sha256)
        );
        assert_eq!(
            d("sam", "lake.new.t", "email"),
            Decision::Mask(Mask::ShowLast4)
        );
        assert_eq!(d("root", "lake.new.t", "email"), Decision::Plaintext);
        // No rule of the tag matches: denied, and the audit names the tag.
        let r = p.decide("nobody", "lake.new.t", "email");
        assert_eq!(r.decision, Decision::Deny);
        assert_eq!(r.rule.to_string(), "tag:pii (default (protected column))");
        assert_eq!(d("ann", "lake.new.t", "name"), Decision::Plaintext);
        // The column's own rule wins over its tags'.
        assert_eq!(d("ann", "lake.sales.customers", "ssn"), Decision::Plaintext);
        assert_eq!(
            d("sam", "lake.sales.customers", "ssn"),
            Decision::Mask(Mask::ShowLast4)
        );
        // Several tags: the strictest.
        assert_eq!(
            d("sam", "lake.sales.customers", "phone"),
            Decision::Mask(Mask::ShowLast4)
        );
        assert_eq!(
            d("ann", "lake.sales.customers", "phone"),
            Decision::Mask(Mask::Null)
        );
        assert!(matches!(
            p.decide("ann", "lake.sales.customers", "phone").rule,
            RuleSource::Tag { ref tag, .. } if tag == "contact"
        ));
        // Keys and writers come from the tags.
        let key = |t: &str, c: &str| p.column_policy(t, c).and_then(|c| c.master_key.clone());
        assert_eq!(key("lake.new.t", "email").as_deref(), Some("pii_key"));
        assert_eq!(
            key("lake.sales.orders", "balance").as_deref(),
            Some("finance_key")
        );
        assert_eq!(key("lake.other.orders", "balance"), None);
        assert_eq!(
            key("lake.sales.customers", "phone").as_deref(),
            Some("pii_key")
        );
        assert!(p.may_write_column("root", "lake.new.t", "email"));
        assert!(!p.may_write_column("ann", "lake.new.t", "email"));
        // Tags naming different keys: nobody reads or writes the column.
        assert_eq!(d("root", "lake.sales.customers", "mixed"), Decision::Deny);
        assert!(!p.may_write_column("root", "lake.sales.customers", "mixed"));
        // A table's policy resolves the tags of the columns it has.
        let t = p.table_policy("lake.new.t", ["id", "email"]).unwrap();
        assert_eq!(t.columns["email"].master_key.as_deref(), Some("pii_key"));
        assert!(!t.columns["email"].plaintext_to_everyone());
        assert!(p.table_policy("lake.new.t", ["id"]).is_none());
    }

    #[test]
    fn unknown_tags_and_bad_patterns_are_reported_with_their_line() {
        let e = Policy::parse(
            &P.replace("tags = [\"pii\", \"finance\"]", "tags = [\"secret\"]"),
            "p.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("unknown tag 'secret'") && e.contains("line 27"),
            "{e}"
        );
        let e = Policy::parse(
            &P.replace("\"lake.sales.*.balance\"", "\"sales.balance\""),
            "p.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("column pattern 'sales.balance'"), "{e}");
        let e = Policy::parse("[tags.x]\naccess = { \"*\" = \"null\" }\n", "p.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("tag 'x' applies to no column"), "{e}");
    }

    #[test]
    fn patterns_match_a_part_per_star_or_a_bare_column_everywhere() {
        assert!(pattern_matches("ssn", "lake.sales.customers", "ssn"));
        assert!(!pattern_matches("ssn", "lake.sales.customers", "ssn2"));
        assert!(pattern_matches(
            "*.*.*.email",
            "lake.sales.customers",
            "email"
        ));
        assert!(pattern_matches(
            "lake.*.customers.*",
            "lake.sales.customers",
            "phone"
        ));
        assert!(!pattern_matches(
            "lake.*.customers.*",
            "lake.sales.orders",
            "phone"
        ));
        // A nested namespace has more parts.
        assert!(!pattern_matches("*.*.*.email", "lake.a.b.t", "email"));
        assert!(pattern_matches("*.*.*.*.email", "lake.a.b.t", "email"));
    }
}
