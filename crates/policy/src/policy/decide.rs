//! Access decisions: what a principal sees of a column or table (most specific rule,
//! most permissive role), and who may write, create, export, decrypt standalone files
//! and use areas.

use crate::model::{Decision, Resolved, RuleSource, TableDecision};

use super::{Area, Policy, RowFilter, Subject};

impl Policy {
    /// Whether `principal` may decrypt standalone files (not in a catalog), per `[files]`.
    pub fn may_decrypt_files(&self, principal: &str) -> bool {
        self.file_decrypt.iter().any(|s| self.matches(s, principal))
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
        match self.column_policy(table, column) {
            Some(c) if c.key_conflict.is_some() => false,
            Some(c) if c.master_key.is_some() => c.write.iter().any(|s| self.matches(s, principal)),
            _ => true,
        }
    }

    /// [`Self::may_write_column`] for a column that is encrypted whether or not the policy
    /// declares a key for it (every column of a table Iceberg encrypts itself): only the
    /// principals its `write` list names (everyone under an open policy).
    pub fn may_write_encrypted_column(&self, principal: &str, table: &str, column: &str) -> bool {
        if !self.is_enforcing() {
            return true;
        }
        self.column_policy(table, column).is_some_and(|c| {
            c.key_conflict.is_none() && c.write.iter().any(|s| self.matches(s, principal))
        })
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

    /// The rows of `table` `principal` may see, if the table has row filters: the
    /// predicate of the principal's `user:` rule, else the predicates of the rules of its
    /// roles (several: any of them lets a row through, as among column rules the most
    /// permissive role wins), else the `*` rule; a table with row filters none of which
    /// matches the principal shows it no rows (`false`: fail closed). `None`: no row
    /// filter.
    pub fn row_filter(&self, principal: &str, table: &str) -> Option<RowFilter> {
        let t = self.tables.get(table)?;
        if t.row_filter.is_empty() {
            return None;
        }
        let pick = |want: &dyn Fn(&Subject) -> bool| -> Vec<&(Subject, String)> {
            t.row_filter.iter().filter(|(s, _)| want(s)).collect()
        };
        let roles = self.roles_of(principal);
        let known = self.is_known(principal);
        let mut chosen = pick(&|s| matches!(s, Subject::User(u) if u == principal));
        if chosen.is_empty() {
            chosen = pick(&|s| matches!(s, Subject::Role(r) if roles.contains(r)));
        }
        if chosen.is_empty() && known {
            chosen = pick(&|s| *s == Subject::Wildcard);
        }
        if chosen.is_empty() {
            return Some(RowFilter {
                predicates: vec!["false".into()],
                rule: "no row filter matches the principal: no rows".into(),
            });
        }
        let rule = chosen
            .iter()
            .map(|(s, _)| match s {
                Subject::User(u) => format!("user:{u}"),
                Subject::Role(r) => format!("role {r}"),
                Subject::Wildcard => "*".into(),
            })
            .collect::<Vec<_>>()
            .join(", ");
        Some(RowFilter {
            predicates: chosen.iter().map(|(_, p)| p.clone()).collect(),
            rule: format!("row_filter of {rule}"),
        })
    }

    /// What `principal` sees of `table.column`. Most specific rule wins (user over role
    /// over `*`); among a user's roles the most permissive decision wins; a column without
    /// a rule of its own for the principal takes the strictest of its tags' decisions (a
    /// tag with no rule for it denies); else a protected column is denied, an
    /// unprotected one is plaintext. Under `hide_inaccessible_columns`, a denied column
    /// of a known principal is hidden instead (the rule that denied it is kept), except
    /// from a principal who may write the table (`INSERT OVERWRITE ... SELECT *` would
    /// write NULLs over a column it cannot see) and where tags conflict over its key (a
    /// misconfiguration the error names).
    pub fn decide(&self, principal: &str, table: &str, column: &str) -> Resolved {
        let r = self.decide_as_written(principal, table, column);
        if r.decision == Decision::Deny
            && r.rule != RuleSource::UnknownPrincipal
            && self.hides_inaccessible_columns(table)
            && !self.may_write_table(principal, table)
            && self
                .column_policy(table, column)
                .is_none_or(|c| c.key_conflict.is_none())
        {
            return Resolved {
                decision: Decision::Hide,
                rule: r.rule,
            };
        }
        r
    }

    /// [`Self::decide`] without `hide_inaccessible_columns` (what the rules say: the
    /// Ranger import compares it with Ranger's decisions).
    pub(crate) fn decide_as_written(&self, principal: &str, table: &str, column: &str) -> Resolved {
        if !self.is_known(principal) {
            return Resolved {
                decision: Decision::Deny,
                rule: RuleSource::UnknownPrincipal,
            };
        }
        let Some(col) = self.column_policy(table, column) else {
            return Resolved {
                decision: Decision::Plaintext,
                rule: RuleSource::DefaultUnprotected,
            };
        };
        if col.key_conflict.is_some() {
            return Resolved {
                decision: Decision::Deny,
                rule: RuleSource::DefaultProtected,
            };
        }
        if let Some((decision, rule)) = self.pick(principal, &col.rules, Decision::rank) {
            return Resolved { decision, rule };
        }
        // The strictest of the column's tags; a tag no rule of which matches denies.
        let strictest = col
            .tag_rules
            .iter()
            .map(|(tag, rules)| {
                let (decision, rule) = self
                    .pick(principal, rules, Decision::rank)
                    .unwrap_or((Decision::Deny, RuleSource::DefaultProtected));
                Resolved {
                    decision,
                    rule: RuleSource::Tag {
                        tag: tag.clone(),
                        rule: Box::new(rule),
                    },
                }
            })
            .min_by_key(|r| r.decision.rank());
        if let Some(r) = strictest {
            return r;
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
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests may block")]
pub(super) mod tests {
    use super::*;
    use crate::model::Mask;

    /// Also the fixture of `parse`'s tests.
    pub(crate) const P: &str = r#"
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

    /// [`P`], parsed.
    pub(crate) fn p() -> Policy {
        Policy::parse(P, "p.toml").unwrap()
    }

    #[test]
    fn row_filters_pick_the_user_rule_then_any_role_then_star_and_else_no_rows() {
        let text = format!(
            "{P}\n[users.carol]\nroles = []\nattributes = {{ region = \"EU\" }}\n\
             [tables.\"lake.sales.orders\".row_filter]\n\
             analyst = \"region = 'EU'\"\nsupport = \"amount < 100\"\n\
             \"user:root\" = \"true\"\n\
             [tables.\"lake.sales.people\".row_filter]\n\"*\" = \"region = principal_attr('region')\"\n"
        )
        .replace("root = { roles = [\"admin\"] }", "root = { roles = [\"admin\", \"analyst\"] }");
        let p = Policy::parse(&text, "p.toml").unwrap();
        let f = |u: &str, t: &str| p.row_filter(u, t).map(|r| r.predicates.join(" | "));
        assert_eq!(
            f("alice", "lake.sales.orders").as_deref(),
            Some("region = 'EU'")
        );
        // bob's two roles: either role's rows.
        assert_eq!(
            f("bob", "lake.sales.orders").as_deref(),
            Some("region = 'EU' | amount < 100")
        );
        // A user rule wins over the user's roles.
        assert_eq!(f("root", "lake.sales.orders").as_deref(), Some("true"));
        // No rule for carol: no rows. An unknown principal too.
        assert_eq!(f("carol", "lake.sales.orders").as_deref(), Some("false"));
        assert_eq!(f("mallory", "lake.sales.people").as_deref(), Some("false"));
        assert_eq!(
            f("carol", "lake.sales.people").as_deref(),
            Some("region = principal_attr('region')")
        );
        assert_eq!(p.attribute("carol", "region"), Some("EU"));
        assert_eq!(p.attribute("alice", "region"), None);
        // A table without row filters has none.
        assert_eq!(f("alice", "lake.sales.customers"), None);
        let e = Policy::parse(
            &format!("{P}\n[tables.\"lake.sales.orders\".row_filter]\nintern = \"true\"\n"),
            "p.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("unknown role 'intern'"), "{e}");
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
    fn hide_inaccessible_columns_hides_what_the_policy_denies_and_nothing_else() {
        // alice (analyst) is denied email (protected, no rule for her).
        let d = |p: &Policy, u: &str, c: &str| p.decide(u, "lake.sales.customers", c);
        assert_eq!(d(&p(), "alice", "email").decision, Decision::Deny);
        let everywhere =
            Policy::parse(&format!("hide_inaccessible_columns = true\n{P}"), "p").unwrap();
        let r = d(&everywhere, "alice", "email");
        assert_eq!(
            (r.decision, r.rule),
            (Decision::Hide, RuleSource::DefaultProtected)
        );
        // Masks, plaintext and an unknown principal's denial stay what they were.
        assert_eq!(
            d(&everywhere, "alice", "ssn").decision,
            Decision::Mask(Mask::Sha256)
        );
        assert_eq!(d(&everywhere, "bob", "email").decision, Decision::Plaintext);
        assert_eq!(d(&everywhere, "mallory", "email").decision, Decision::Deny);
        // A principal who may write the table keeps the denial.
        let writer = Policy::parse(
            &format!("hide_inaccessible_columns = true\n[writes]\ncreate = [\"user:alice\"]\n{P}"),
            "p",
        )
        .unwrap();
        assert_eq!(d(&writer, "alice", "email").decision, Decision::Deny);
        // A table's own setting wins over the policy's.
        let one_table = Policy::parse(
            &format!(
                "hide_inaccessible_columns = true\n{P}\n[tables.\"lake.sales.customers\"]\nhide_inaccessible_columns = false\n"
            ),
            "p",
        )
        .unwrap();
        assert_eq!(d(&one_table, "alice", "email").decision, Decision::Deny);
        let e = Policy::parse(&format!("hide_inaccessible_columns = \"yes\"\n{P}"), "p")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 1") && e.contains("boolean"), "{e}");
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
pub(super) mod area_tests {
    use super::*;

    /// Also the fixture of `parse`'s tests.
    pub(crate) const P: &str = r#"
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
}
