//! Import of an Apache Ranger policy export (Hive or Trino service; the JSON of Ranger's
//! "Export" button or `GET /service/plugins/policies/exportJson`) into ClearIce policy text.
//!
//! ```text
//!  export.json ─▶ translate (access, masking, row-filter policies ─▶ per-table rules, notes)
//!              ─▶ emit (merged into a base policy.toml, its comments kept)
//!              ─▶ reconcile (for every user the policy knows, Ranger's answer and ClearIce's
//!                 are compared; a user rule is added where ClearIce would be more permissive)
//!              ─▶ Policy::parse (the output is a valid policy)
//! ```
//!
//! What ClearIce cannot express is either dropped when it grants (stricter: a note says so)
//! or refused when it restricts (a deny, mask or row filter on a wildcard, excluded or
//! non-table resource): an import is never more permissive than the export.

use serde::Deserialize;

use crate::error::{Error, Result};

mod emit;
mod reconcile;
#[cfg(test)]
mod tests;
mod translate;

/// What to import and where the tables live.
#[derive(Debug, Clone, Copy)]
pub struct RangerOptions<'a> {
    /// The ClearIce catalog Hive databases (Trino schemas) are namespaces of.
    pub catalog: &'a str,
    /// Import only the policies of this Ranger service (default: every Hive and Trino one).
    pub service: Option<&'a str>,
}

/// The imported policy and what the import could not carry over exactly.
#[derive(Debug, Clone)]
pub struct RangerImport {
    /// The policy text (the base's, with the imported rules merged in); it parses.
    pub policy_text: String,
    /// One line per policy or item not imported exactly, for the operator to review.
    pub notes: Vec<String>,
}

/// Imports a Ranger export (`export_source` names it in errors and notes) into policy text,
/// merged into `base` (its text and name) if given.
pub fn import_ranger(
    export: &str,
    export_source: &str,
    options: &RangerOptions<'_>,
    base: Option<(&str, &str)>,
) -> Result<RangerImport> {
    let bad = |message: String| Error::RangerExport {
        source_name: export_source.into(),
        message,
    };
    let parsed: Export = serde_json::from_str(export).map_err(|e| bad(e.to_string()))?;
    let base_policy = base
        .map(|(text, name)| crate::Policy::parse(text, name))
        .transpose()?;
    let mut imported = translate::translate(&parsed, options, &bad)?;
    let mut doc = emit::Document::new(base.map(|(t, _)| t), base_policy.as_ref(), &bad)?;
    let replaced = doc.merge(&imported);
    imported.notes.extend(replaced);
    let source = base.map_or("imported policy", |(_, n)| n);
    let policy = crate::Policy::parse(&doc.text(), source)?;
    let fixes = reconcile::user_rules(&policy, &imported);
    if !fixes.is_empty() {
        doc.add_user_rules(&fixes);
        let policy = crate::Policy::parse(&doc.text(), source)?;
        let left = reconcile::user_rules(&policy, &imported);
        if let Some(f) = left.first() {
            return Err(bad(format!(
                "internal: user '{}' on '{}' still differs from Ranger after the import",
                f.user, f.table
            )));
        }
        imported.notes.push(format!(
            "{} user rule(s) were added so that the users the policy knows get Ranger's answer \
             where ClearIce's precedence (the most permissive role wins) would give more: {}",
            fixes.len(),
            reconcile::describe(&fixes)
        ));
    }
    Ok(RangerImport {
        policy_text: doc.text(),
        notes: imported.notes,
    })
}

/// A Ranger export: `{"metaDataInfo": {...}, "policies": [...]}` (other keys ignored).
#[derive(Debug, Deserialize)]
struct Export {
    #[serde(default)]
    policies: Vec<RangerPolicy>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RangerPolicy {
    #[serde(default)]
    id: Option<i64>,
    #[serde(default)]
    name: String,
    #[serde(default)]
    service: String,
    #[serde(default)]
    service_type: Option<String>,
    #[serde(default = "enabled")]
    is_enabled: bool,
    /// 0 access, 1 data masking, 2 row filtering.
    #[serde(default)]
    policy_type: Option<i64>,
    #[serde(default)]
    resources: std::collections::BTreeMap<String, Resource>,
    #[serde(default)]
    policy_items: Vec<Item>,
    #[serde(default)]
    deny_policy_items: Vec<Item>,
    #[serde(default)]
    allow_exceptions: Vec<Item>,
    #[serde(default)]
    deny_exceptions: Vec<Item>,
    #[serde(default)]
    data_mask_policy_items: Vec<MaskItem>,
    #[serde(default)]
    row_filter_policy_items: Vec<FilterItem>,
    #[serde(default)]
    validity_schedules: Vec<serde_json::Value>,
    /// Deny every subject the policy does not allow, whatever other policies grant.
    #[serde(default)]
    is_deny_all_else: bool,
    /// A security zone's policy (its resources follow only the zone's policies).
    #[serde(default)]
    zone_name: Option<String>,
}

fn enabled() -> bool {
    true
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Resource {
    #[serde(default)]
    values: Vec<String>,
    #[serde(default)]
    is_excludes: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Item {
    #[serde(default)]
    accesses: Vec<Access>,
    #[serde(default)]
    users: Vec<String>,
    #[serde(default)]
    groups: Vec<String>,
    #[serde(default)]
    roles: Vec<String>,
    #[serde(default)]
    conditions: Vec<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Access {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default = "enabled")]
    is_allowed: bool,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MaskItem {
    #[serde(flatten)]
    item: Item,
    #[serde(default)]
    data_mask_info: Option<MaskInfo>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MaskInfo {
    #[serde(default)]
    data_mask_type: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FilterItem {
    #[serde(flatten)]
    item: Item,
    #[serde(default)]
    row_filter_info: Option<FilterInfo>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FilterInfo {
    #[serde(default)]
    filter_expr: Option<String>,
}

impl RangerPolicy {
    /// How notes and errors name the policy.
    fn label(&self) -> String {
        match self.id {
            Some(id) => format!("policy {id} '{}' ({})", self.name, self.service),
            None => format!("policy '{}' ({})", self.name, self.service),
        }
    }
}
