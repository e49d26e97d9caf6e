//! Iceberg REST `ReadRestrictions`: what a REST catalog's `loadTable` answer requires of
//! a reader for the principal it authenticated (`read-restrictions`, apache/iceberg PR
//! 13879): per column an action (`required-column-projections`, by field id) and a row
//! filter (`required-row-filter`, an Iceberg expression). Parsed here into ClearIce's
//! terms; the access layer combines them with the local policy (the stricter wins) and
//! applies them like its own masks and row filters.
//!
//! Fail closed, as the spec asks of a reader: anything that cannot be applied exactly (an
//! unknown action or expression type, `sha-256-query-local`, `apply-expression`, a
//! transform term, a field listed twice, a key this parser does not know) is an error,
//! and the table is refused, never read without it.
//!
//! ```
//! use clearice_policy::{CatalogMask, Decision, Mask, ReadRestrictions, RowPredicate};
//! let r = ReadRestrictions::parse(&serde_json::json!({
//!     "required-column-projections": [{"field-id": 3, "action": "mask-alphanum"}],
//!     "required-row-filter": {"type": "eq", "term": "region", "value": "EU"}
//! })).unwrap();
//! assert_eq!(r.projections[0].decision, Decision::Mask(Mask::Catalog(CatalogMask::MaskAlphanum)));
//! assert!(matches!(r.row_filter, Some(RowPredicate::Compare { .. })));
//! ```

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use crate::model::{CatalogMask, Decision, Mask};

/// One column's required action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Projection {
    /// The column's Iceberg field id.
    pub field_id: i32,
    /// The action as the catalog named it (for the audit log).
    pub action: String,
    /// The mask that computes it.
    pub decision: Decision,
}

/// A comparison of a column with a literal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareOp {
    /// `lt`
    Lt,
    /// `lt-eq`
    LtEq,
    /// `gt`
    Gt,
    /// `gt-eq`
    GtEq,
    /// `eq`
    Eq,
    /// `not-eq`
    NotEq,
    /// `starts-with`
    StartsWith,
    /// `not-starts-with`
    NotStartsWith,
}

/// A test of a column alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnaryOp {
    /// `is-null`
    IsNull,
    /// `not-null`
    NotNull,
    /// `is-nan`
    IsNan,
    /// `not-nan`
    NotNan,
}

/// A literal of an Iceberg expression, as JSON gave it; its meaning depends on the
/// column's type (dates, timestamps and decimals are strings, binary is hex).
#[derive(Debug, Clone, PartialEq)]
pub enum Literal {
    /// `true` / `false`.
    Bool(bool),
    /// A JSON number, as written (parsed by the column's type).
    Number(String),
    /// A JSON string.
    String(String),
}

/// A required row filter: the rows the principal may see are those for which it is true
/// (false or NULL: discarded).
#[derive(Debug, Clone, PartialEq)]
pub enum RowPredicate {
    /// Every row.
    True,
    /// No row.
    False,
    /// Both.
    And(Box<RowPredicate>, Box<RowPredicate>),
    /// Either.
    Or(Box<RowPredicate>, Box<RowPredicate>),
    /// Negation.
    Not(Box<RowPredicate>),
    /// A test of one column.
    Unary {
        /// What is tested.
        op: UnaryOp,
        /// The column, by its name in the table's current schema.
        column: String,
    },
    /// A comparison of one column with a literal.
    Compare {
        /// The comparison.
        op: CompareOp,
        /// The column, by its name in the table's current schema.
        column: String,
        /// The value.
        value: Literal,
    },
    /// Membership (`in`, or `not-in` when `negated`).
    In {
        /// `not-in`.
        negated: bool,
        /// The column, by its name in the table's current schema.
        column: String,
        /// The values.
        values: Vec<Literal>,
    },
}

impl RowPredicate {
    /// Whether it keeps every row.
    pub fn is_true(&self) -> bool {
        matches!(self, RowPredicate::True)
    }
}

/// A table's read restrictions for one principal.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ReadRestrictions {
    /// Required column actions, at most one per field id.
    pub projections: Vec<Projection>,
    /// The required row filter (`None`: absent, null or `true`).
    pub row_filter: Option<RowPredicate>,
}

/// Deepest expression nesting accepted (a catalog's answer is bounded, but recursion is
/// not allowed to take the stack).
const MAX_DEPTH: usize = 64;

impl ReadRestrictions {
    /// Parses the `read-restrictions` object of a `LoadTableResult`. `Err`: a line
    /// saying what cannot be applied (no values of the table in it, beyond the
    /// catalog's own filter literals).
    pub fn parse(v: &Value) -> Result<Self, String> {
        let obj = match v {
            Value::Null => return Ok(Self::default()),
            Value::Object(o) => o,
            other => {
                return Err(format!(
                    "read-restrictions is not an object: {}",
                    kind(other)
                ));
            }
        };
        if let Some(k) = obj.keys().find(|k| {
            !matches!(
                k.as_str(),
                "required-column-projections" | "required-row-filter"
            )
        }) {
            return Err(format!(
                "read-restrictions has '{}', which ClearIce does not know how to apply",
                clip(k)
            ));
        }
        let mut projections = Vec::new();
        match obj.get("required-column-projections") {
            None | Some(Value::Null) => {}
            Some(Value::Array(items)) => {
                let mut seen = BTreeSet::new();
                for item in items {
                    let p = projection(item)?;
                    if !seen.insert(p.field_id) {
                        return Err(format!(
                            "required-column-projections lists field id {} twice",
                            p.field_id
                        ));
                    }
                    projections.push(p);
                }
            }
            Some(other) => {
                return Err(format!(
                    "required-column-projections is not an array: {}",
                    kind(other)
                ));
            }
        }
        let row_filter = match obj.get("required-row-filter") {
            None | Some(Value::Null) => None,
            Some(e) => Some(expression(e, 0)?).filter(|p| !p.is_true()),
        };
        Ok(Self {
            projections,
            row_filter,
        })
    }

    /// Whether it restricts nothing.
    pub fn is_empty(&self) -> bool {
        self.projections.is_empty() && self.row_filter.is_none()
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A name from the catalog's answer, cut for an error line.
fn clip(s: &str) -> String {
    let s: String = s.chars().filter(|c| !c.is_control()).take(64).collect();
    s
}

fn projection(item: &Value) -> Result<Projection, String> {
    let Value::Object(o) = item else {
        return Err(format!(
            "a required column projection is not an object: {}",
            kind(item)
        ));
    };
    let field_id = o
        .get("field-id")
        .and_then(Value::as_i64)
        .and_then(|i| i32::try_from(i).ok())
        .ok_or("a required column projection has no integer field-id")?;
    let action = o
        .get("action")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("the projection of field id {field_id} has no action"))?;
    if let Some(k) = o
        .keys()
        .find(|k| !matches!(k.as_str(), "field-id" | "action"))
    {
        return Err(format!(
            "the projection of field id {field_id} has '{}', which ClearIce does not know how to apply",
            clip(k)
        ));
    }
    let mask = match action {
        "replace-with-null" => Mask::Null,
        "truncate-to-year" => Mask::TruncateToYear,
        "truncate-to-month" => Mask::TruncateToMonth,
        "mask-alphanum" => Mask::Catalog(CatalogMask::MaskAlphanum),
        "show-first-4" => Mask::Catalog(CatalogMask::ShowFirst4),
        "show-last-4" => Mask::Catalog(CatalogMask::ShowLast4),
        "mask-to-default" => Mask::Catalog(CatalogMask::MaskToDefault),
        "sha-256-global" => Mask::Catalog(CatalogMask::Sha256Global),
        "sha-256-query-local" | "apply-expression" => {
            return Err(format!(
                "action '{action}' on field id {field_id} is not implemented in ClearIce"
            ));
        }
        other => {
            return Err(format!(
                "unknown action '{}' on field id {field_id}",
                clip(other)
            ));
        }
    };
    Ok(Projection {
        field_id,
        action: action.to_owned(),
        decision: Decision::Mask(mask),
    })
}

fn field<'a>(o: &'a Map<String, Value>, name: &str, ty: &str) -> Result<&'a Value, String> {
    o.get(name)
        .ok_or_else(|| format!("a '{ty}' row filter expression has no '{name}'"))
}

/// A term: a column reference by name (transforms cannot be evaluated here).
fn term(o: &Map<String, Value>, ty: &str) -> Result<String, String> {
    match field(o, "term", ty)? {
        Value::String(s) if !s.is_empty() => Ok(s.clone()),
        Value::Object(t) => Err(format!(
            "a '{ty}' row filter on a '{}' term cannot be evaluated by ClearIce",
            clip(t.get("type").and_then(Value::as_str).unwrap_or("?"))
        )),
        other => Err(format!(
            "a '{ty}' row filter's term is not a column name: {}",
            kind(other)
        )),
    }
}

fn literal(v: &Value, ty: &str) -> Result<Literal, String> {
    Ok(match v {
        Value::Bool(b) => Literal::Bool(*b),
        Value::Number(n) => Literal::Number(n.to_string()),
        Value::String(s) => Literal::String(s.clone()),
        other => {
            return Err(format!(
                "a '{ty}' row filter's value is {}, not a primitive value",
                kind(other)
            ));
        }
    })
}

fn expression(v: &Value, depth: usize) -> Result<RowPredicate, String> {
    if depth > MAX_DEPTH {
        return Err(format!(
            "the row filter is nested deeper than {MAX_DEPTH} levels"
        ));
    }
    let o = match v {
        Value::Bool(true) => return Ok(RowPredicate::True),
        Value::Bool(false) => return Ok(RowPredicate::False),
        Value::Object(o) => o,
        other => {
            return Err(format!(
                "a row filter expression is {}, not an object",
                kind(other)
            ));
        }
    };
    let ty = o
        .get("type")
        .and_then(Value::as_str)
        .ok_or("a row filter expression has no type")?;
    let allowed: &[&str] = match ty {
        "true" | "false" => &["type"],
        "and" | "or" => &["type", "left", "right"],
        "not" => &["type", "child"],
        "is-null" | "not-null" | "is-nan" | "not-nan" => &["type", "term"],
        "in" | "not-in" => &["type", "term", "values"],
        _ => &["type", "term", "value"],
    };
    if let Some(k) = o.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(format!(
            "a '{}' row filter expression has '{}', which ClearIce does not know how to apply",
            clip(ty),
            clip(k)
        ));
    }
    let sub = |name: &str| expression(field(o, name, ty)?, depth + 1).map(Box::new);
    let cmp = |op| -> Result<RowPredicate, String> {
        Ok(RowPredicate::Compare {
            op,
            column: term(o, ty)?,
            value: literal(field(o, "value", ty)?, ty)?,
        })
    };
    let unary = |op| -> Result<RowPredicate, String> {
        Ok(RowPredicate::Unary {
            op,
            column: term(o, ty)?,
        })
    };
    Ok(match ty {
        "true" => RowPredicate::True,
        "false" => RowPredicate::False,
        "and" => RowPredicate::And(sub("left")?, sub("right")?),
        "or" => RowPredicate::Or(sub("left")?, sub("right")?),
        "not" => RowPredicate::Not(sub("child")?),
        "is-null" => unary(UnaryOp::IsNull)?,
        "not-null" => unary(UnaryOp::NotNull)?,
        "is-nan" => unary(UnaryOp::IsNan)?,
        "not-nan" => unary(UnaryOp::NotNan)?,
        "lt" => cmp(CompareOp::Lt)?,
        "lt-eq" => cmp(CompareOp::LtEq)?,
        "gt" => cmp(CompareOp::Gt)?,
        "gt-eq" => cmp(CompareOp::GtEq)?,
        "eq" => cmp(CompareOp::Eq)?,
        "not-eq" => cmp(CompareOp::NotEq)?,
        "starts-with" => cmp(CompareOp::StartsWith)?,
        "not-starts-with" => cmp(CompareOp::NotStartsWith)?,
        "in" | "not-in" => {
            let Value::Array(values) = field(o, "values", ty)? else {
                return Err(format!("a '{ty}' row filter's values are not an array"));
            };
            RowPredicate::In {
                negated: ty == "not-in",
                column: term(o, ty)?,
                values: values
                    .iter()
                    .map(|v| literal(v, ty))
                    .collect::<Result<_, _>>()?,
            }
        }
        other => {
            return Err(format!(
                "unknown row filter expression type '{}'",
                clip(other)
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(v: Value) -> String {
        ReadRestrictions::parse(&v).unwrap_err()
    }

    #[test]
    fn absent_empty_and_true_restrict_nothing() {
        for v in [
            Value::Null,
            json!({}),
            json!({"required-column-projections": []}),
            json!({"required-row-filter": true}),
            json!({"required-row-filter": {"type": "true"}}),
            json!({"required-row-filter": null}),
        ] {
            assert!(ReadRestrictions::parse(&v).unwrap().is_empty(), "{v}");
        }
    }

    #[test]
    fn every_spec_action_maps_to_its_mask() {
        let r = ReadRestrictions::parse(&json!({"required-column-projections": [
            {"field-id": 1, "action": "replace-with-null"},
            {"field-id": 2, "action": "truncate-to-year"},
            {"field-id": 3, "action": "truncate-to-month"},
            {"field-id": 4, "action": "mask-alphanum"},
            {"field-id": 5, "action": "show-first-4"},
            {"field-id": 6, "action": "show-last-4"},
            {"field-id": 7, "action": "mask-to-default"},
            {"field-id": 8, "action": "sha-256-global"},
        ]}))
        .unwrap();
        let names: Vec<&str> = r.projections.iter().map(|p| p.decision.name()).collect();
        assert_eq!(
            names,
            [
                "null",
                "truncate_to_year",
                "truncate_to_month",
                "mask-alphanum",
                "show-first-4",
                "show-last-4",
                "mask-to-default",
                "sha-256-global"
            ]
        );
    }

    #[test]
    fn what_cannot_be_applied_is_an_error_naming_it() {
        let e =
            err(json!({"required-column-projections": [{"field-id": 3, "action": "scramble"}]}));
        assert!(e.contains("unknown action 'scramble' on field id 3"), "{e}");
        let e = err(
            json!({"required-column-projections": [{"field-id": 3, "action": "sha-256-query-local"}]}),
        );
        assert!(e.contains("not implemented"), "{e}");
        let e = err(json!({"required-column-projections": [
            {"field-id": 3, "action": "apply-expression", "expression": true}]}));
        assert!(
            e.contains("not implemented") || e.contains("expression"),
            "{e}"
        );
        let e = err(json!({"required-column-projections": [
            {"field-id": 3, "action": "mask-alphanum"}, {"field-id": 3, "action": "replace-with-null"}]}));
        assert!(e.contains("twice"), "{e}");
        let e = err(json!({"required-row-filter": {"type": "unknown-predicate"}}));
        assert!(e.contains("unknown-predicate"), "{e}");
        let e = err(json!({"required-row-filter": {"type": "eq",
            "term": {"type": "transform", "transform": "bucket[4]", "term": "id"}, "value": 1}}));
        assert!(e.contains("transform"), "{e}");
        let e = err(
            json!({"required-row-filter": {"type": "eq", "term": "a", "value": 1, "case": "x"}}),
        );
        assert!(e.contains("'case'"), "{e}");
        let e = err(json!({"required-masks": []}));
        assert!(e.contains("required-masks"), "{e}");
        let e = err(json!({"required-row-filter": "a = 1"}));
        assert!(e.contains("string"), "{e}");
    }

    #[test]
    fn expressions_parse_into_predicates() {
        let r = ReadRestrictions::parse(&json!({"required-row-filter": {
            "type": "and",
            "left": {"type": "in", "term": "country", "values": ["DE", "FR"]},
            "right": {"type": "not", "child": {"type": "is-null", "term": "birth_date"}}
        }}))
        .unwrap();
        let f = r.row_filter.unwrap();
        let RowPredicate::And(l, r) = f else {
            panic!("{f:?}")
        };
        assert_eq!(
            *r,
            RowPredicate::Not(Box::new(RowPredicate::Unary {
                op: UnaryOp::IsNull,
                column: "birth_date".into()
            }))
        );
        assert_eq!(
            *l,
            RowPredicate::In {
                negated: false,
                column: "country".into(),
                values: vec![Literal::String("DE".into()), Literal::String("FR".into())],
            }
        );
        let r = ReadRestrictions::parse(&json!({"required-row-filter": false})).unwrap();
        assert_eq!(r.row_filter, Some(RowPredicate::False));
    }

    #[test]
    fn deep_nesting_is_refused_not_a_stack_overflow() {
        let mut v = json!({"type": "is-null", "term": "a"});
        for _ in 0..1_000 {
            v = json!({"type": "not", "child": v});
        }
        assert!(err(json!({"required-row-filter": v})).contains("deeper"));
    }

    #[test]
    fn stricter_of_two_rules() {
        let m = |m| Decision::Mask(m);
        assert_eq!(
            Decision::Plaintext.stricter(m(Mask::Catalog(CatalogMask::MaskAlphanum))),
            m(Mask::Catalog(CatalogMask::MaskAlphanum))
        );
        assert_eq!(
            m(Mask::ShowLast4).stricter(m(Mask::Catalog(CatalogMask::ShowLast4))),
            m(Mask::Null)
        );
        assert_eq!(m(Mask::Null).stricter(Decision::Plaintext), m(Mask::Null));
        assert_eq!(Decision::Hide.stricter(m(Mask::Null)), Decision::Hide);
        assert_eq!(m(Mask::Null).stricter(Decision::Deny), Decision::Deny);
        assert_eq!(
            m(Mask::TruncateToYear).stricter(m(Mask::TruncateToYear)),
            m(Mask::TruncateToYear)
        );
    }
}
