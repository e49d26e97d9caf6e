//! A REST catalog's read restrictions for the session's principal, in the table's terms:
//! column actions by the table's column index, the row filter over the columns' current
//! names. Combined with the local policy by the caller (`try_new`): masks through
//! [`Decision::stricter`], the row filter AND-ed with the policy's (`row_filter.rs`).
//!
//! Fail closed: an answer that cannot be applied exactly (an unknown or unimplemented
//! action, an action on a column of a type it does not apply to, a field id or a column
//! name the table does not have, a principal the catalog cannot be asked for) denies the
//! table to the principal, naming why; a catalog that cannot be reached fails the
//! statement.

use std::collections::BTreeMap;

use clearice_iceberg::IcebergTableProvider;
use clearice_iceberg::field_id::field_id;
use clearice_iceberg::restrictions::Refused;
use clearice_policy::{Decision, ReadRestrictions, RowPredicate};
use datafusion::catalog::TableProvider;
use datafusion::error::Result;

use crate::mask;

/// What the catalog requires of this principal's reads.
#[derive(Debug, Default)]
pub(crate) struct CatalogRestrictions {
    /// By inner column index: the catalog's action and its mask.
    pub(super) columns: BTreeMap<usize, (String, Decision)>,
    /// The required row filter, over the table's current column names.
    pub(super) row_filter: Option<RowPredicate>,
    /// Names the source for rules, EXPLAIN and the audit log.
    pub(crate) rule: String,
}

/// The outcome of asking.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Not a table of a REST catalog (nothing asked), or no restrictions.
    None,
    /// Apply these.
    Apply(CatalogRestrictions),
    /// The table is denied to the principal: why.
    Deny(String),
}

/// Asks `inner`'s REST catalog, as `principal`, what it requires.
pub(crate) async fn load(inner: &IcebergTableProvider, principal: &str) -> Result<Outcome> {
    let catalog = inner
        .name()
        .split('.')
        .next()
        .unwrap_or_default()
        .to_owned();
    let loaded = match inner.read_restrictions(principal).await? {
        None => return Ok(Outcome::None),
        Some(Err(Refused::NoToken { principal })) => {
            return Ok(Outcome::Deny(format!(
                "catalog '{catalog}' returns read restrictions per principal, and has no token for principal '{principal}' (catalogs.{catalog}.principal_tokens)"
            )));
        }
        Some(Err(Refused::Status { status })) => {
            return Ok(Outcome::Deny(format!(
                "catalog '{catalog}' refuses to load the table for the principal (HTTP {status})"
            )));
        }
        Some(Ok(l)) => l,
    };
    let rule = format!("read restriction of catalog '{catalog}'");
    // The restrictions are for the table scanned, not one dropped and created again under
    // its name between the two loads.
    if loaded.table_uuid.as_deref() != Some(inner.table().metadata().uuid().to_string().as_str()) {
        return Ok(Outcome::Deny(format!(
            "{rule} cannot be applied: the catalog's answer is for another table (table-uuid)"
        )));
    }
    let parsed = match ReadRestrictions::parse(&loaded.restrictions) {
        Ok(p) => p,
        Err(why) => return Ok(Outcome::Deny(format!("{rule} cannot be applied: {why}"))),
    };
    if parsed.is_empty() {
        return Ok(Outcome::None);
    }
    let schema = inner.schema();
    let by_id = |id: i32| schema.fields().iter().position(|f| field_id(f) == Some(id));
    let mut columns = BTreeMap::new();
    for p in parsed.projections {
        let Some(i) = by_id(p.field_id) else {
            return Ok(Outcome::Deny(format!(
                "{rule} cannot be applied: '{}' on field id {}, which is not a top-level column of the table",
                p.action, p.field_id
            )));
        };
        let f = schema.field(i);
        if let Decision::Mask(m) = &p.decision
            && let Err(e) = mask::check(m, &inner.current_name(f), f.data_type())
        {
            return Ok(Outcome::Deny(format!(
                "{rule} cannot be applied: {}",
                crate::one_line(&e)
            )));
        }
        columns.insert(i, (p.action, p.decision));
    }
    // A column the scanned snapshot has but the catalog's current schema does not (dropped
    // since, read by time travel) is one the catalog cannot restrict: denied.
    for (i, f) in schema.fields().iter().enumerate() {
        let current = field_id(f).is_some_and(|id| loaded.fields.iter().any(|(c, _)| *c == id));
        if !current {
            columns.entry(i).or_insert_with(|| {
                (
                    "none: the column is not in the catalog's current schema".to_owned(),
                    Decision::Deny,
                )
            });
        }
    }
    // The filter names columns as the catalog's answer does; by field id they are the
    // scanned table's columns under their current names (a rename between the two loads
    // cannot move the filter onto another column).
    let row_filter = match parsed.row_filter {
        None => None,
        Some(f) => {
            let mut missing = None;
            let renamed = rename(&f, &mut |name| {
                let current = loaded
                    .fields
                    .iter()
                    .find(|(_, n)| n == name)
                    .and_then(|(id, _)| by_id(*id))
                    .map(|i| inner.current_name(schema.field(i)));
                if current.is_none() {
                    missing.get_or_insert_with(|| name.to_owned());
                }
                current.unwrap_or_default()
            });
            if let Some(name) = missing {
                return Ok(Outcome::Deny(format!(
                    "{rule} cannot be applied: its row filter names '{}', which is not a top-level column of the table",
                    name.chars().take(64).collect::<String>()
                )));
            }
            Some(renamed)
        }
    };
    Ok(Outcome::Apply(CatalogRestrictions {
        columns,
        row_filter,
        rule,
    }))
}

/// `p` with every column name passed through `to`.
fn rename(p: &RowPredicate, to: &mut dyn FnMut(&str) -> String) -> RowPredicate {
    match p {
        RowPredicate::True => RowPredicate::True,
        RowPredicate::False => RowPredicate::False,
        RowPredicate::And(a, b) => {
            RowPredicate::And(Box::new(rename(a, to)), Box::new(rename(b, to)))
        }
        RowPredicate::Or(a, b) => {
            RowPredicate::Or(Box::new(rename(a, to)), Box::new(rename(b, to)))
        }
        RowPredicate::Not(a) => RowPredicate::Not(Box::new(rename(a, to))),
        RowPredicate::Unary { op, column } => RowPredicate::Unary {
            op: *op,
            column: to(column),
        },
        RowPredicate::Compare { op, column, value } => RowPredicate::Compare {
            op: *op,
            column: to(column),
            value: value.clone(),
        },
        RowPredicate::In {
            negated,
            column,
            values,
        } => RowPredicate::In {
            negated: *negated,
            column: to(column),
            values: values.clone(),
        },
    }
}
