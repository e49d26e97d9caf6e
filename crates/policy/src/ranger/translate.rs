//! Ranger policies to per-table rules: resources to `catalog.namespace.table` names, items'
//! users, groups and roles to subject keys, accesses to table reads and writes, mask types
//! to decisions, row-filter macros to `principal()` / `principal_attr('x')`.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::{Error, Result};
use crate::model::{Decision, Mask};

use super::{Item, RangerOptions, RangerPolicy, Resource};

/// A subject key as the policy file writes it: `user:NAME`, a role, or `*`.
pub(super) type Key = String;

/// What the export says of one table, in Ranger's terms.
#[derive(Debug, Default)]
pub(super) struct TableRules {
    /// Who may read it (Ranger: any matching deny wins, else any matching allow, else
    /// denied).
    pub read_allow: BTreeSet<Key>,
    /// Who is denied reading it.
    pub read_deny: BTreeSet<Key>,
    /// Who may change it (rows and definition).
    pub write_allow: BTreeSet<Key>,
    /// Who is denied changing it.
    pub write_deny: BTreeSet<Key>,
    /// Per column: who is denied it, and its mask items in Ranger's order.
    pub columns: BTreeMap<String, ColumnRules>,
    /// Row-filter items in Ranger's order (the first matching one applies), translated.
    pub row_filters: Vec<(Vec<Key>, String)>,
    /// The row-filter policy they come from (one per table, as for masks).
    pub filter_policy: Option<String>,
}

/// What the export says of one column.
#[derive(Debug, Default)]
pub(super) struct ColumnRules {
    /// Who is denied the column.
    pub deny: BTreeSet<Key>,
    /// Mask items in Ranger's order (the first matching one applies).
    pub masks: Vec<(Vec<Key>, Decision)>,
    /// The masking policy they come from (one per column: Ranger orders several by
    /// priority and its own evaluation order, which the export does not say).
    pub mask_policy: Option<String>,
}

/// The export translated.
#[derive(Debug, Default)]
pub(super) struct Imported {
    /// Users the items name (`[users]`).
    pub users: BTreeSet<String>,
    /// Groups and Ranger roles the items name (`[roles]`).
    pub roles: BTreeSet<String>,
    /// Tables by `catalog.namespace.table`.
    pub tables: BTreeMap<String, TableRules>,
    /// What was not imported exactly.
    pub notes: Vec<String>,
}

/// Where a policy applies.
enum Target {
    /// Tables, and `None` for every column or the columns named.
    Tables(Vec<String>, Option<Vec<String>>),
    /// Another catalog's (Trino): not this import's.
    OtherCatalog,
}

#[derive(Clone, Copy, PartialEq)]
enum Service {
    Hive,
    Trino,
}

/// Accesses that change a table, per service: all of them (or `all`) grant ClearIce's
/// `write`, which covers rows and definition alike.
fn write_accesses(service: Service) -> &'static [&'static str] {
    match service {
        Service::Hive => &["update", "alter", "drop"],
        Service::Trino => &["insert", "delete", "update", "alter", "drop"],
    }
}

pub(super) fn translate(
    export: &super::Export,
    options: &RangerOptions<'_>,
    bad: &dyn Fn(String) -> Error,
) -> Result<Imported> {
    let mut out = Imported::default();
    for p in &export.policies {
        if options.service.is_some_and(|s| s != p.service) {
            continue;
        }
        let label = p.label();
        let service = match p.service_type.as_deref() {
            Some("hive") => Service::Hive,
            Some("trino" | "presto") => Service::Trino,
            Some("tag") if restricts_anything(p) => {
                return Err(bad(format!(
                    "{label}: a tag-based restriction, which needs the tag assignments the export \
                     does not hold: import with --service NAME and write [tags.*] by hand"
                )));
            }
            Some(other) => {
                out.notes.push(format!(
                    "{label}: service type '{other}' is not Hive or Trino: skipped"
                ));
                continue;
            }
            None if p.resources.contains_key("database") => Service::Hive,
            None if p.resources.contains_key("schema") => Service::Trino,
            None => {
                out.notes.push(format!(
                    "{label}: no service type and no database or schema resource: skipped"
                ));
                continue;
            }
        };
        if !p.is_enabled {
            out.notes.push(format!("{label}: disabled: skipped"));
            continue;
        }
        let kind = p.policy_type.unwrap_or(0);
        let restricts = restricts_anything(p);
        if p.zone_name.as_deref().is_some_and(|z| !z.is_empty()) {
            return Err(bad(format!(
                "{label}: a security zone's policy (zone '{}'): a zone's resources follow only \
                 its own policies, which ClearIce cannot express; export one zone at a time",
                p.zone_name.as_deref().unwrap_or_default()
            )));
        }
        if p.is_deny_all_else {
            return Err(bad(format!(
                "{label}: isDenyAllElse (deny everyone it does not allow, whatever other \
                 policies grant) cannot be imported; write the rule by hand"
            )));
        }
        if kind != 0
            && (!p.validity_schedules.is_empty()
                || p.data_mask_policy_items
                    .iter()
                    .any(|m| !m.item.conditions.is_empty())
                || p.row_filter_policy_items
                    .iter()
                    .any(|f| !f.item.conditions.is_empty()))
        {
            return Err(bad(format!(
                "{label}: a mask or row filter with conditions or validity schedules: applied \
                 always or never, it could show more than Ranger; write the rule by hand"
            )));
        }
        let (tables, columns) = match target(p, service, options.catalog) {
            Ok(Target::Tables(t, c)) => (t, c),
            Ok(Target::OtherCatalog) => {
                out.notes.push(format!(
                    "{label}: another Trino catalog's (not '{}'): skipped",
                    options.catalog
                ));
                continue;
            }
            Err(reason) if restricts => {
                return Err(bad(format!(
                    "{label}: {reason}, and ClearIce cannot express its restriction there: \
                     remove the policy from the export or write its rule by hand"
                )));
            }
            Err(reason) => {
                out.notes.push(format!(
                    "{label}: {reason}: its grants are not imported (stricter)"
                ));
                continue;
            }
        };
        for t in &tables {
            out.tables.entry(t.clone()).or_default();
        }
        match kind {
            0 => access(p, service, &tables, columns.as_deref(), &mut out, bad)?,
            1 => {
                let Some(columns) = columns else {
                    return Err(bad(format!(
                        "{label}: a mask on every column ('*'), which ClearIce cannot express: \
                         name the columns"
                    )));
                };
                masks(p, &tables, &columns, &mut out, bad)?
            }
            2 => filters(p, &tables, &mut out, bad)?,
            other => {
                return Err(bad(format!(
                    "{label}: policy type {other} is not access (0), masking (1) or row filter (2)"
                )));
            }
        }
    }
    Ok(out)
}

/// Whether the policy denies, masks or filters anything.
fn restricts_anything(p: &RangerPolicy) -> bool {
    p.policy_type.unwrap_or(0) != 0 || !p.deny_policy_items.is_empty()
}

/// The tables and columns a policy's resources name, or why ClearIce cannot name them.
fn target(
    p: &RangerPolicy,
    service: Service,
    catalog: &str,
) -> std::result::Result<Target, String> {
    let (names, namespace): (&[&str], &str) = match service {
        Service::Hive => (&["database", "table", "column"], "database"),
        Service::Trino => (&["catalog", "schema", "table", "column"], "schema"),
    };
    if let Some(other) = p.resources.keys().find(|k| !names.contains(&k.as_str())) {
        return Err(format!("its resource '{other}' is not a table or column"));
    }
    // Hive and Trino names are case-insensitive (stored lowercase).
    let exact = |name: &str| -> std::result::Result<&[String], String> {
        let r: &Resource = p
            .resources
            .get(name)
            .ok_or_else(|| format!("it names no {name}"))?;
        if r.is_excludes {
            return Err(format!("it excludes {name}s ({})", r.values.join(", ")));
        }
        if r.values.is_empty() {
            return Err(format!("it names no {name}"));
        }
        if let Some(w) = r.values.iter().find(|v| v.contains(['*', '?'])) {
            return Err(format!("its {name} '{w}' is a wildcard"));
        }
        if let Some(d) = r.values.iter().find(|v| v.contains('.')) {
            return Err(format!(
                "its {name} '{d}' has a dot, which ClearIce's table names cannot tell apart"
            ));
        }
        Ok(&r.values)
    };
    if service == Service::Trino {
        let c = p
            .resources
            .get("catalog")
            .ok_or_else(|| "it names no catalog".to_owned())?;
        if c.is_excludes {
            return Err(format!("it excludes catalogs ({})", c.values.join(", ")));
        }
        if let Some(w) = c
            .values
            .iter()
            .find(|v| *v != "*" && v.contains(['*', '?']))
        {
            return Err(format!("its catalog '{w}' is a wildcard"));
        }
        if !c.values.iter().any(|v| v == catalog || v == "*") {
            return Ok(Target::OtherCatalog);
        }
    }
    let namespaces = exact(namespace)?;
    let tables = exact("table")?;
    let columns = match p.resources.get("column") {
        None => None,
        Some(r) if r.is_excludes => {
            return Err(format!("it excludes columns ({})", r.values.join(", ")));
        }
        Some(r) if r.values.is_empty() || r.values.iter().any(|v| v == "*") => None,
        Some(r) => {
            if let Some(w) = r.values.iter().find(|v| v.contains(['*', '?'])) {
                return Err(format!("its column '{w}' is a wildcard"));
            }
            Some(r.values.clone())
        }
    };
    let full = namespaces
        .iter()
        .flat_map(|n| {
            tables
                .iter()
                .map(move |t| format!("{catalog}.{}.{}", n.to_lowercase(), t.to_lowercase()))
        })
        .collect();
    let columns = columns.map(|cs| cs.iter().map(|c| c.to_lowercase()).collect());
    Ok(Target::Tables(full, columns))
}

/// An item's subjects as keys (users, groups, roles declared in `out`). `restricts`: the
/// item denies, masks or filters, so a subject ClearIce cannot name is refused, not
/// dropped.
fn keys(
    item: &Item,
    label: &str,
    restricts: bool,
    out: &mut Imported,
    bad: &dyn Fn(String) -> Error,
) -> Result<Vec<Key>> {
    let mut keys = Vec::new();
    let mut unnamable = Vec::new();
    for u in &item.users {
        match u.as_str() {
            "{USER}" => keys.push("*".to_owned()),
            _ if u.is_empty() || u.starts_with('{') => unnamable.push(format!("user '{u}'")),
            _ => {
                out.users.insert(u.clone());
                keys.push(format!("user:{u}"));
            }
        }
    }
    for (kind, g) in item
        .groups
        .iter()
        .map(|g| ("group", g))
        .chain(item.roles.iter().map(|r| ("role", r)))
    {
        match g.as_str() {
            "public" if kind == "group" => keys.push("*".to_owned()),
            _ if g.is_empty() || g == "*" || g.starts_with("user:") || g.starts_with('{') => {
                unnamable.push(format!("{kind} '{g}'"))
            }
            _ => {
                out.roles.insert(g.clone());
                keys.push(g.clone());
            }
        }
    }
    if !unnamable.is_empty() {
        let which = unnamable.join(", ");
        if restricts {
            return Err(bad(format!(
                "{label}: {which} has no ClearIce equivalent, and the item restricts: \
                 remove it from the export or write the rule by hand"
            )));
        }
        out.notes.push(format!(
            "{label}: {which}: no ClearIce equivalent, not granted"
        ));
    }
    keys.sort();
    keys.dedup();
    Ok(keys)
}

fn allowed(item: &Item) -> impl Iterator<Item = String> {
    item.accesses
        .iter()
        .filter(|a| a.is_allowed)
        .map(|a| a.kind.to_ascii_lowercase())
}

fn access(
    p: &RangerPolicy,
    service: Service,
    tables: &[String],
    columns: Option<&[String]>,
    out: &mut Imported,
    bad: &dyn Fn(String) -> Error,
) -> Result<()> {
    let label = p.label();
    let writes = write_accesses(service);
    let grants_skipped = if !p.allow_exceptions.is_empty() {
        Some("it has allow exceptions")
    } else if !p.validity_schedules.is_empty() {
        Some("it has validity schedules")
    } else {
        None
    };
    if let Some(why) = grants_skipped.filter(|_| !p.policy_items.is_empty()) {
        out.notes.push(format!(
            "{label}: {why}, which ClearIce cannot express: its grants are not imported (stricter)"
        ));
    }
    if !p.deny_exceptions.is_empty()
        || (!p.validity_schedules.is_empty() && !p.deny_policy_items.is_empty())
    {
        out.notes.push(format!(
            "{label}: its deny exceptions and validity schedules are not imported: its denies \
             apply to every subject they name, always (stricter)"
        ));
    }
    let items = p.policy_items.iter().filter(|_| grants_skipped.is_none());
    for item in items {
        if !item.conditions.is_empty() {
            out.notes.push(format!(
                "{label}: an allow item with conditions is not imported (stricter)"
            ));
            continue;
        }
        let kinds: BTreeSet<String> = allowed(item).collect();
        let has = |k: &str| kinds.contains(k);
        let read = has("select") || has("all");
        let write = has("all") || writes.iter().all(|w| has(w));
        if !write && writes.iter().any(|w| has(w)) {
            out.notes.push(format!(
                "{label}: grants only some of {} (ClearIce's write is all of them): write not granted",
                writes.join(", ")
            ));
        }
        if !read && !write {
            continue;
        }
        if let Some(cols) = columns {
            out.notes.push(format!(
                "{label}: grants on columns {} only, which ClearIce cannot express (it grants \
                 tables): not imported (stricter)",
                cols.join(", ")
            ));
            continue;
        }
        let keys = keys(item, &label, false, out, bad)?;
        for t in tables {
            let rules = out.tables.entry(t.clone()).or_default();
            if read {
                rules.read_allow.extend(keys.iter().cloned());
            }
            if write {
                rules.write_allow.extend(keys.iter().cloned());
            }
        }
    }
    for item in &p.deny_policy_items {
        if !item.conditions.is_empty() {
            out.notes.push(format!(
                "{label}: a deny item's conditions are not imported: it always applies (stricter)"
            ));
        }
        let kinds: BTreeSet<String> = allowed(item).collect();
        let has = |k: &str| kinds.contains(k);
        let read = has("select") || has("all");
        let write = has("all") || writes.iter().any(|w| has(w));
        if !read && !write {
            continue;
        }
        let keys = keys(item, &label, true, out, bad)?;
        if write && columns.is_some() {
            out.notes.push(format!(
                "{label}: denies changing some columns: ClearIce denies changing the whole table (stricter)"
            ));
        }
        for t in tables {
            let rules = out.tables.entry(t.clone()).or_default();
            if write {
                rules.write_deny.extend(keys.iter().cloned());
            }
            match (read, columns) {
                (false, _) => {}
                (true, None) => rules.read_deny.extend(keys.iter().cloned()),
                (true, Some(cols)) => {
                    for c in cols {
                        let col = rules.columns.entry(c.clone()).or_default();
                        col.deny.extend(keys.iter().cloned());
                    }
                }
            }
        }
    }
    Ok(())
}

/// A Ranger mask type as a decision, and a note when it is not exactly Ranger's.
fn mask(kind: &str) -> (Decision, Option<&'static str>) {
    match kind {
        "MASK_NONE" => (Decision::Plaintext, None),
        "MASK_NULL" => (Decision::Mask(Mask::Null), None),
        "MASK_SHOW_LAST_4" => (Decision::Mask(Mask::ShowLast4), None),
        "MASK_SHOW_FIRST_4" => (Decision::Mask(Mask::ShowFirst4), None),
        "MASK_HASH" => (
            Decision::Mask(Mask::Sha256),
            Some(
                "MASK_HASH is an unkeyed sha256, as in Ranger: anyone can confirm a guess; consider hmac_sha256",
            ),
        ),
        "MASK_DATE_SHOW_YEAR" => (Decision::Mask(Mask::TruncateToYear), None),
        "MASK" => (
            Decision::Mask(Mask::Fixed(None)),
            Some(
                "MASK (redact letter by letter) is imported as fixed: a constant, which shows less",
            ),
        ),
        "CUSTOM" => (
            Decision::Mask(Mask::Null),
            Some("a CUSTOM mask's expression is not imported: its subjects see NULL"),
        ),
        _ => (
            Decision::Mask(Mask::Null),
            Some("an unknown mask type is imported as null"),
        ),
    }
}

fn masks(
    p: &RangerPolicy,
    tables: &[String],
    columns: &[String],
    out: &mut Imported,
    bad: &dyn Fn(String) -> Error,
) -> Result<()> {
    let label = p.label();
    for m in &p.data_mask_policy_items {
        let kind = m
            .data_mask_info
            .as_ref()
            .map_or("", |i| i.data_mask_type.as_str());
        let (decision, note) = mask(kind);
        if let Some(note) = note {
            out.notes.push(format!("{label}: {note} ('{kind}')"));
        }
        let keys = keys(&m.item, &label, true, out, bad)?;
        for t in tables {
            let rules = out.tables.entry(t.clone()).or_default();
            for c in columns {
                let col = rules.columns.entry(c.clone()).or_default();
                one_policy(
                    &mut col.mask_policy,
                    &label,
                    &format!("column '{t}.{c}'"),
                    bad,
                )?;
                col.masks.push((keys.clone(), decision.clone()));
            }
        }
    }
    Ok(())
}

fn filters(
    p: &RangerPolicy,
    tables: &[String],
    out: &mut Imported,
    bad: &dyn Fn(String) -> Error,
) -> Result<()> {
    let label = p.label();
    for f in &p.row_filter_policy_items {
        let expr = f
            .row_filter_info
            .as_ref()
            .and_then(|i| i.filter_expr.as_deref())
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .unwrap_or("true");
        let expr = match filter_macros(expr) {
            Ok(e) => e,
            Err(unknown) => {
                out.notes.push(format!(
                    "{label}: the row filter's macro '{unknown}' has no ClearIce equivalent: \
                     its subjects see no rows"
                ));
                "false".to_owned()
            }
        };
        let keys = keys(&f.item, &label, true, out, bad)?;
        for t in tables {
            let rules = out.tables.entry(t.clone()).or_default();
            one_policy(
                &mut rules.filter_policy,
                &label,
                &format!("table '{t}'"),
                bad,
            )?;
            rules.row_filters.push((keys.clone(), expr.clone()));
        }
    }
    Ok(())
}

/// Records `label` as the one masking (row-filter) policy of `what`; a second one fails:
/// which of two Ranger applies first depends on priorities and an evaluation order the
/// export does not carry.
fn one_policy(
    slot: &mut Option<String>,
    label: &str,
    what: &str,
    bad: &dyn Fn(String) -> Error,
) -> Result<()> {
    match slot {
        Some(first) if first != label => Err(bad(format!(
            "{label} and {first} both mask or filter {what}: which applies first depends on \
             Ranger's evaluation order, which the export does not carry; merge them into one policy"
        ))),
        _ => {
            *slot = Some(label.to_owned());
            Ok(())
        }
    }
}

/// Ranger's row-filter macros in ClearIce's terms: `current_user()` and `${{USER._name}}`
/// are `principal()`, `${{USER.x}}` is `principal_attr('x')` (quoted or not). `Err`: the
/// first other macro.
pub(super) fn filter_macros(expr: &str) -> std::result::Result<String, String> {
    let mut out = String::with_capacity(expr.len());
    let mut rest = expr;
    while let Some(start) = rest.find("${{") {
        let Some(len) = rest[start..].find("}}").map(|e| e + 2) else {
            return Err(rest[start..].to_owned());
        };
        let quoted = rest[..start].ends_with('\'') && rest[start + len..].starts_with('\'');
        let name = &rest[start + 3..start + len - 2];
        let replacement = match name.strip_prefix("USER.") {
            Some("_name") => "principal()".to_owned(),
            Some(attr)
                if !attr.is_empty()
                    && attr.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') =>
            {
                format!("principal_attr('{attr}')")
            }
            _ => return Err(rest[start..start + len].to_owned()),
        };
        if quoted {
            out.push_str(&rest[..start - 1]);
            out.push_str(&replacement);
            rest = &rest[start + len + 1..];
        } else {
            out.push_str(&rest[..start]);
            out.push_str(&replacement);
            rest = &rest[start + len..];
        }
    }
    out.push_str(rest);
    Ok(replace_ignore_case(&out, "current_user()", "principal()"))
}

fn replace_ignore_case(text: &str, from: &str, to: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for (i, _) in lower.match_indices(from) {
        out.push_str(&text[last..i]);
        out.push_str(to);
        last = i + from.len();
    }
    out.push_str(&text[last..]);
    out
}

#[cfg(test)]
mod tests {
    use super::filter_macros;

    #[test]
    fn filter_macros_become_principal_functions_and_others_are_refused() {
        assert_eq!(
            filter_macros("region = '${{USER.region}}' and owner = CURRENT_USER()").unwrap(),
            "region = principal_attr('region') and owner = principal()"
        );
        assert_eq!(
            filter_macros("owner = ${{USER._name}}").unwrap(),
            "owner = principal()"
        );
        assert_eq!(
            filter_macros("dept in (${{GET_UG_ATTR_Q_CSV('dept')}})").unwrap_err(),
            "${{GET_UG_ATTR_Q_CSV('dept')}}"
        );
        assert_eq!(
            filter_macros("x = '${{USER.a b}}'").unwrap_err(),
            "${{USER.a b}}"
        );
        assert_eq!(filter_macros("a = '${{USER.x").unwrap_err(), "${{USER.x");
    }
}
