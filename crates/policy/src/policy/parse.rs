//! Parsing and validation of the policy file: the TOML shape (`Raw*`), subjects and
//! decisions checked against `[users]`/`[roles]` with the line of any error, and the
//! check of a policy against a table's columns (`clearice policy check`).

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use toml::Spanned;

use crate::error::{Error, Result};
use crate::model::{ColumnKind, Decision, Mask, MissingKey, TableDecision};

use super::{Area, ColumnPolicy, Policy, Subject, TablePolicy, Tag};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    #[serde(default)]
    on_missing_key: Option<Spanned<String>>,
    #[serde(default)]
    hide_inaccessible_columns: bool,
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
    #[serde(default)]
    masks: Option<RawMasks>,
    #[serde(default)]
    tags: BTreeMap<Spanned<String>, RawTag>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTag {
    /// Column patterns.
    #[serde(default)]
    columns: Vec<Spanned<String>>,
    #[serde(default)]
    master_key: Option<String>,
    #[serde(default)]
    footer_key: Option<String>,
    #[serde(default)]
    provider: Option<String>,
    #[serde(default)]
    access: BTreeMap<Spanned<String>, Spanned<toml::Value>>,
    #[serde(default)]
    write: Vec<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMasks {
    /// The `hmac_sha256` mask's secret (a file; relative: to the policy file).
    #[serde(default)]
    hmac_key_file: Option<Spanned<String>>,
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
    /// Attributes row filters read (`principal_attr('region')`).
    #[serde(default)]
    attributes: BTreeMap<String, String>,
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
    /// Row filters: subject → SQL predicate over the table's columns.
    #[serde(default)]
    row_filter: BTreeMap<Spanned<String>, Spanned<String>>,
    #[serde(default)]
    hide_inaccessible_columns: Option<bool>,
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
    /// Tags the column is classified with.
    #[serde(default)]
    tags: Vec<Spanned<String>>,
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
        "hmac_sha256" => Decision::Mask(Mask::HmacSha256),
        "truncate_to_year" => Decision::Mask(Mask::TruncateToYear),
        "truncate_to_month" => Decision::Mask(Mask::TruncateToMonth),
        "hide" => Decision::Hide,
        "deny" => Decision::Deny,
        _ => return None,
    })
}

const DECISIONS: &str = "plaintext, null, fixed, show_last_4, show_first_4, sha256, hmac_sha256, truncate_to_year, truncate_to_month, hide, deny";

impl Policy {
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
        let mut attributes = BTreeMap::new();
        for (name, u) in &raw.users {
            if !u.attributes.is_empty() {
                attributes.insert(name.get_ref().clone(), u.attributes.clone());
            }
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
        let hmac_key_file = raw
            .masks
            .as_ref()
            .and_then(|m| m.hmac_key_file.as_ref())
            .map(|f| {
                if f.get_ref().trim().is_empty() {
                    Err(err(f.span().start, "an empty hmac_key_file".into()))
                } else {
                    Ok(f.get_ref().clone())
                }
            })
            .transpose()?;
        // Access rules (`{ subject = "decision" | { mask, value } }`) of a column or tag.
        let parse_rules = |access: &BTreeMap<Spanned<String>, Spanned<toml::Value>>| -> Result<Vec<(Subject, Decision)>> {
            let mut rules = Vec::new();
            for (k, v) in access {
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
                if d == Decision::Mask(Mask::HmacSha256) && hmac_key_file.is_none() {
                    return Err(err(
                        v.span().start,
                        "mask 'hmac_sha256' needs the policy's secret: add [masks] hmac_key_file = \"FILE\"".into(),
                    ));
                }
                rules.push((s, d));
            }
            Ok(rules)
        };
        let mut tags = BTreeMap::new();
        for (name, t) in &raw.tags {
            if t.columns.is_empty()
                && !raw.tables.values().any(|tb| {
                    tb.columns
                        .values()
                        .any(|c| c.tags.iter().any(|n| n.get_ref() == name.get_ref()))
                })
            {
                return Err(err(
                    name.span().start,
                    format!(
                        "tag '{}' applies to no column: give it `columns` patterns or name it in a column's `tags`",
                        name.get_ref()
                    ),
                ));
            }
            for p in &t.columns {
                let bad = p.get_ref().is_empty()
                    || p.get_ref().split('.').any(str::is_empty)
                    || (p.get_ref().contains('.') && p.get_ref().split('.').count() < 4);
                if bad {
                    return Err(err(
                        p.span().start,
                        format!(
                            "tag '{}': column pattern '{}' must be a column name or catalog.namespace.table.column (`*` for any part)",
                            name.get_ref(),
                            p.get_ref()
                        ),
                    ));
                }
            }
            tags.insert(
                name.get_ref().clone(),
                Tag {
                    columns: t.columns.iter().map(|p| p.get_ref().clone()).collect(),
                    master_key: t.master_key.clone(),
                    footer_key: t.footer_key.clone(),
                    provider: t.provider.clone(),
                    rules: parse_rules(&t.access)?,
                    write: t.write.iter().map(&subject).collect::<Result<_>>()?,
                },
            );
        }
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
                let rules = parse_rules(&c.access)?;
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
                        tags: c
                            .tags
                            .iter()
                            .map(|n| {
                                if raw.tags.keys().any(|k| k.get_ref() == n.get_ref()) {
                                    Ok(n.get_ref().clone())
                                } else {
                                    Err(err(
                                        n.span().start,
                                        format!(
                                            "unknown tag '{}' (declare it in [tags])",
                                            n.get_ref()
                                        ),
                                    ))
                                }
                            })
                            .collect::<Result<_>>()?,
                        tag_rules: Vec::new(),
                        key_conflict: None,
                    },
                );
            }
            let mut row_filter = Vec::new();
            for (k, v) in &t.row_filter {
                if v.get_ref().trim().is_empty() {
                    return Err(err(
                        v.span().start,
                        "an empty row filter (write \"true\" for every row)".into(),
                    ));
                }
                row_filter.push((subject(k)?, v.get_ref().clone()));
            }
            tables.insert(
                tname.get_ref().clone(),
                TablePolicy {
                    row_filter,
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
                    hide_inaccessible_columns: t.hide_inaccessible_columns,
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
            attributes,
            roles,
            file_decrypt,
            areas,
            tables,
            on_missing_key,
            hide_inaccessible_columns: raw.hide_inaccessible_columns,
            creators,
            hmac_key_file,
            tags,
        })
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
    use crate::policy::decide::tests::{P, p};

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
    fn hmac_mask_without_a_key_file_is_reported_and_with_one_is_less_permissive_than_sha256() {
        let keyed = P.replace("support = \"null\"", "support = \"hmac_sha256\"");
        let e = Policy::parse(&keyed, "p.toml").unwrap_err().to_string();
        assert!(
            e.contains("line 14") && e.contains("add [masks] hmac_key_file"),
            "{e}"
        );
        let p = Policy::parse(
            &format!("[masks]\nhmac_key_file = \"hmac.key\"\n{keyed}"),
            "p.toml",
        )
        .unwrap();
        assert_eq!(p.hmac_key_file(), Some("hmac.key"));
        let d = |u: &str| p.decide(u, "lake.sales.customers", "ssn").decision;
        assert_eq!(
            d("root"),
            Decision::Plaintext,
            "the fixture changed: root is admin"
        );
        // bob is analyst (show_last_4) and support (hmac_sha256): the most permissive.
        assert_eq!(d("bob"), Decision::Mask(Mask::ShowLast4));
        assert!(
            Decision::Mask(Mask::HmacSha256).rank() < Decision::Mask(Mask::Sha256).rank()
                && Decision::Mask(Mask::HmacSha256).rank()
                    > Decision::Mask(Mask::Fixed(None)).rank()
        );
        let e = Policy::parse("[masks]\nhmac_key_file = \" \"\n", "p.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("an empty hmac_key_file"), "{e}");
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
mod area_tests {
    use super::*;
    use crate::policy::decide::area_tests::P;

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
