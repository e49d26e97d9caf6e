//! A REST catalog's required row filter ([`RowPredicate`], an Iceberg expression) as a
//! DataFusion predicate over the table's columns. Built as an expression tree, never as
//! SQL text: a literal is parsed by its column's type ([`ScalarValue::try_from_string`]),
//! so no value from the catalog becomes SQL. Three-valued logic: a NULL column value
//! satisfies no comparison (`not-eq`, `not-in` and `not-starts-with` included), so a row
//! is only ever dropped where Iceberg's own evaluator might keep it, never the reverse.

use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Column, DFSchema};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{Expr, lit};
use datafusion::scalar::ScalarValue;

use clearice_policy::{CompareOp, Literal, RowPredicate, UnaryOp};

/// `p` over `schema` (columns by their current names).
pub(super) fn to_expr(p: &RowPredicate, schema: &DFSchema) -> Result<Expr> {
    Ok(match p {
        RowPredicate::True => lit(true),
        RowPredicate::False => lit(false),
        RowPredicate::And(a, b) => to_expr(a, schema)?.and(to_expr(b, schema)?),
        RowPredicate::Or(a, b) => to_expr(a, schema)?.or(to_expr(b, schema)?),
        RowPredicate::Not(a) => Expr::Not(Box::new(to_expr(a, schema)?)),
        RowPredicate::Unary { op, column } => {
            let (c, dt) = column_of(column, schema)?;
            match op {
                UnaryOp::IsNull => c.is_null(),
                UnaryOp::NotNull => c.is_not_null(),
                UnaryOp::IsNan | UnaryOp::NotNan => {
                    if !matches!(dt, DataType::Float32 | DataType::Float64) {
                        return Err(bad(column, &dt, "is-nan applies to floating point columns"));
                    }
                    let nan = datafusion::functions::math::expr_fn::isnan(c);
                    if *op == UnaryOp::IsNan {
                        nan
                    } else {
                        Expr::Not(Box::new(nan))
                    }
                }
            }
        }
        RowPredicate::Compare { op, column, value } => {
            let (c, dt) = column_of(column, schema)?;
            let v = lit(scalar(value, column, &dt)?);
            match op {
                CompareOp::Lt => c.lt(v),
                CompareOp::LtEq => c.lt_eq(v),
                CompareOp::Gt => c.gt(v),
                CompareOp::GtEq => c.gt_eq(v),
                CompareOp::Eq => c.eq(v),
                CompareOp::NotEq => c.not_eq(v),
                CompareOp::StartsWith | CompareOp::NotStartsWith => {
                    if !is_string(&dt) {
                        return Err(bad(column, &dt, "starts-with applies to string columns"));
                    }
                    let s = datafusion::functions::string::expr_fn::starts_with(c, v);
                    if *op == CompareOp::StartsWith {
                        s
                    } else {
                        Expr::Not(Box::new(s))
                    }
                }
            }
        }
        RowPredicate::In {
            negated,
            column,
            values,
        } => {
            let (c, dt) = column_of(column, schema)?;
            if values.is_empty() {
                return Ok(lit(*negated));
            }
            let values = values
                .iter()
                .map(|v| scalar(v, column, &dt).map(lit))
                .collect::<Result<Vec<_>>>()?;
            c.in_list(values, *negated)
        }
    })
}

/// The filter as text, for EXPLAIN, errors and the audit log.
pub(super) fn display(p: &RowPredicate) -> String {
    let quote = |c: &str| format!("\"{}\"", c.replace('"', "\"\""));
    let value = |v: &Literal| match v {
        Literal::Bool(b) => b.to_string(),
        Literal::Number(n) => n.clone(),
        Literal::String(s) => format!("'{}'", s.replace('\'', "''")),
    };
    match p {
        RowPredicate::True => "true".into(),
        RowPredicate::False => "false".into(),
        RowPredicate::And(a, b) => format!("({} AND {})", display(a), display(b)),
        RowPredicate::Or(a, b) => format!("({} OR {})", display(a), display(b)),
        RowPredicate::Not(a) => format!("NOT {}", display(a)),
        RowPredicate::Unary { op, column } => {
            let c = quote(column);
            match op {
                UnaryOp::IsNull => format!("{c} IS NULL"),
                UnaryOp::NotNull => format!("{c} IS NOT NULL"),
                UnaryOp::IsNan => format!("isnan({c})"),
                UnaryOp::NotNan => format!("NOT isnan({c})"),
            }
        }
        RowPredicate::Compare {
            op,
            column,
            value: v,
        } => {
            let (c, v) = (quote(column), value(v));
            match op {
                CompareOp::Lt => format!("{c} < {v}"),
                CompareOp::LtEq => format!("{c} <= {v}"),
                CompareOp::Gt => format!("{c} > {v}"),
                CompareOp::GtEq => format!("{c} >= {v}"),
                CompareOp::Eq => format!("{c} = {v}"),
                CompareOp::NotEq => format!("{c} <> {v}"),
                CompareOp::StartsWith => format!("starts_with({c}, {v})"),
                CompareOp::NotStartsWith => format!("NOT starts_with({c}, {v})"),
            }
        }
        RowPredicate::In {
            negated,
            column,
            values,
        } => format!(
            "{} {}IN ({})",
            quote(column),
            if *negated { "NOT " } else { "" },
            values.iter().map(value).collect::<Vec<_>>().join(", ")
        ),
    }
}

fn is_string(dt: &DataType) -> bool {
    match dt {
        DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8 => true,
        DataType::Dictionary(_, v) => is_string(v),
        _ => false,
    }
}

fn bad(column: &str, dt: &DataType, why: &str) -> DataFusionError {
    DataFusionError::Plan(format!(
        "the catalog's row filter on column '{column}' of type {dt} cannot be evaluated: {why}"
    ))
}

/// The column (unqualified, exactly as named) and its type.
fn column_of(name: &str, schema: &DFSchema) -> Result<(Expr, DataType)> {
    let f = schema.field_with_unqualified_name(name).map_err(|_| {
        DataFusionError::Plan(format!("the catalog's row filter names no column '{name}'"))
    })?;
    Ok((
        Expr::Column(Column::new_unqualified(name)),
        f.data_type().clone(),
    ))
}

/// A literal as a value of the column's type (a dictionary column's value type).
fn scalar(v: &Literal, column: &str, dt: &DataType) -> Result<ScalarValue> {
    let dt = match dt {
        DataType::Dictionary(_, v) => v.as_ref(),
        dt => dt,
    };
    let supported = dt.is_numeric()
        || is_string(dt)
        || matches!(
            dt,
            DataType::Boolean | DataType::Date32 | DataType::Timestamp(..) | DataType::Time64(_)
        );
    if !supported {
        return Err(bad(column, dt, "literals of this type are not supported"));
    }
    let text = match (v, dt) {
        (Literal::Bool(b), DataType::Boolean) => return Ok(ScalarValue::Boolean(Some(*b))),
        (Literal::Bool(_), _) => return Err(bad(column, dt, "a boolean literal")),
        (Literal::Number(_), dt) if !dt.is_numeric() => {
            return Err(bad(column, dt, "a numeric literal"));
        }
        (Literal::Number(n) | Literal::String(n), _) => n.clone(),
    };
    ScalarValue::try_from_string(text, dt)
        .ok()
        .filter(|s| !s.is_null())
        .ok_or_else(|| bad(column, dt, "a literal that is not of the column's type"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{Field, Schema, TimeUnit};
    use serde_json::json;

    fn schema() -> DFSchema {
        DFSchema::try_from(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new(
                "country",
                DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
                true,
            ),
            Field::new("Balance", DataType::Decimal128(12, 2), true),
            Field::new(
                "ts",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
            Field::new("blob", DataType::Binary, true),
        ]))
        .unwrap()
    }

    fn expr(v: serde_json::Value) -> Result<Expr> {
        let r =
            clearice_policy::ReadRestrictions::parse(&json!({ "required-row-filter": v })).unwrap();
        to_expr(&r.row_filter.unwrap(), &schema())
    }

    #[test]
    fn literals_take_their_column_type() {
        let e = expr(json!({"type": "and",
            "left": {"type": "in", "term": "country", "values": ["DE", "FR"]},
            "right": {"type": "gt-eq", "term": "Balance", "value": "10.50"}}))
        .unwrap();
        let text = e.to_string();
        assert!(
            text.contains("country IN ([Utf8(\"DE\"), Utf8(\"FR\")])"),
            "{text}"
        );
        assert!(
            text.contains("Balance >= Decimal128(Some(1050),12,2)"),
            "{text}"
        );
        let e = expr(json!({"type": "lt", "term": "ts", "value": "2020-01-01T00:00:00+00:00"}));
        assert!(e.is_ok(), "{e:?}");
    }

    #[test]
    fn what_cannot_be_evaluated_is_an_error() {
        let e = expr(json!({"type": "eq", "term": "blob", "value": "78797A"})).unwrap_err();
        assert!(e.to_string().contains("blob"), "{e}");
        let e = expr(json!({"type": "eq", "term": "id", "value": "x1"})).unwrap_err();
        assert!(e.to_string().contains("not of the column's type"), "{e}");
        let e = expr(json!({"type": "eq", "term": "nope", "value": 1})).unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
        let e = expr(json!({"type": "is-nan", "term": "id"})).unwrap_err();
        assert!(e.to_string().contains("floating"), "{e}");
        let e = expr(json!({"type": "starts-with", "term": "id", "value": "1"})).unwrap_err();
        assert!(e.to_string().contains("string"), "{e}");
    }

    #[test]
    fn display_quotes_names_and_values() {
        let r = clearice_policy::ReadRestrictions::parse(&json!({"required-row-filter":
            {"type": "not-in", "term": "na\"me", "values": ["O'Brien", 3]}}))
        .unwrap();
        assert_eq!(
            display(&r.row_filter.unwrap()),
            "\"na\"\"me\" NOT IN ('O''Brien', 3)"
        );
    }
}
