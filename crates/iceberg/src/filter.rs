//! DataFusion filters to Iceberg predicates, for manifest and partition pruning in
//! `plan_files()`. Conversion is all-or-nothing per conjunct: a conjunct that cannot be
//! converted exactly is left out (the filter still runs in DataFusion above the scan).

use datafusion::logical_expr::{BinaryExpr, Expr, Operator};
use datafusion::scalar::ScalarValue;
use iceberg::expr::{Predicate, Reference};
use iceberg::spec::{Datum, PrimitiveType, Schema, Type};

/// Converts the conjuncts that can be converted; `None` when none can.
pub fn to_iceberg_predicate(filters: &[Expr], schema: &Schema) -> Option<Predicate> {
    let mut conjuncts = Vec::new();
    for f in filters {
        split_and(f, &mut conjuncts);
    }
    conjuncts
        .into_iter()
        .filter_map(|e| convert(e, schema))
        .reduce(Predicate::and)
}

fn split_and<'a>(e: &'a Expr, out: &mut Vec<&'a Expr>) {
    match e {
        Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::And,
            right,
        }) => {
            split_and(left, out);
            split_and(right, out);
        }
        other => out.push(other),
    }
}

fn column_type<'a>(e: &Expr, schema: &'a Schema) -> Option<(String, &'a PrimitiveType)> {
    let Expr::Column(c) = e else { return None };
    let field = schema.field_by_name(&c.name)?;
    match field.field_type.as_ref() {
        Type::Primitive(p) => Some((c.name.clone(), p)),
        _ => None,
    }
}

/// `v` as an Iceberg literal of `ty`; none for `float` and `double`: Iceberg's bounds
/// leave NaN out and its comparisons with NaN are false, while DataFusion (as DuckDB and
/// PostgreSQL) orders NaN above every number, so `x > 3` pruned by Iceberg would drop
/// the NaN rows DataFusion returns.
fn datum(v: &ScalarValue, ty: &PrimitiveType) -> Option<Datum> {
    use ScalarValue as S;
    Some(match (ty, v) {
        (PrimitiveType::Boolean, S::Boolean(Some(b))) => Datum::bool(*b),
        (PrimitiveType::Int, S::Int32(Some(i))) => Datum::int(*i),
        (PrimitiveType::Int, S::Int64(Some(i))) => Datum::int(i32::try_from(*i).ok()?),
        (PrimitiveType::Long, S::Int64(Some(i))) => Datum::long(*i),
        (PrimitiveType::Long, S::Int32(Some(i))) => Datum::long(*i),
        (PrimitiveType::Date, S::Date32(Some(d))) => Datum::date(*d),
        (
            PrimitiveType::String,
            S::Utf8(Some(s)) | S::Utf8View(Some(s)) | S::LargeUtf8(Some(s)),
        ) => Datum::string(s),
        (PrimitiveType::Timestamptz, S::TimestampMicrosecond(Some(t), Some(_))) => {
            Datum::timestamptz_micros(*t)
        }
        (PrimitiveType::Timestamp, S::TimestampMicrosecond(Some(t), None)) => {
            Datum::timestamp_micros(*t)
        }
        _ => return None,
    })
}

fn literal(e: &Expr) -> Option<&ScalarValue> {
    match e {
        Expr::Literal(v, _) => Some(v),
        _ => None,
    }
}

fn convert(e: &Expr, schema: &Schema) -> Option<Predicate> {
    match e {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => match op {
            Operator::And => Some(convert(left, schema)?.and(convert(right, schema)?)),
            Operator::Or => Some(convert(left, schema)?.or(convert(right, schema)?)),
            _ => {
                let (col, lit, op) = match (column_type(left, schema), literal(right)) {
                    (Some(c), Some(l)) => (c, l, *op),
                    _ => (column_type(right, schema)?, literal(left)?, op.swap()?),
                };
                let (name, ty) = col;
                let d = datum(lit, ty)?;
                let r = Reference::new(name);
                Some(match op {
                    Operator::Eq => r.equal_to(d),
                    Operator::NotEq => r.not_equal_to(d),
                    Operator::Lt => r.less_than(d),
                    Operator::LtEq => r.less_than_or_equal_to(d),
                    Operator::Gt => r.greater_than(d),
                    Operator::GtEq => r.greater_than_or_equal_to(d),
                    _ => return None,
                })
            }
        },
        Expr::Not(inner) => Some(!convert(inner, schema)?),
        Expr::IsNull(inner) => Some(Reference::new(column_type(inner, schema)?.0).is_null()),
        Expr::IsNotNull(inner) => Some(Reference::new(column_type(inner, schema)?.0).is_not_null()),
        Expr::InList(l) => {
            let (name, ty) = column_type(&l.expr, schema)?;
            let data: Option<Vec<Datum>> = l.list.iter().map(|x| datum(literal(x)?, ty)).collect();
            let r = Reference::new(name);
            Some(if l.negated {
                r.is_not_in(data?)
            } else {
                r.is_in(data?)
            })
        }
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests may block")]
mod tests {
    use super::*;
    use datafusion::prelude::{col, lit};
    use iceberg::spec::NestedField;
    use std::sync::Arc;

    fn schema() -> Schema {
        Schema::builder()
            .with_fields(vec![
                Arc::new(NestedField::required(
                    1,
                    "id",
                    Type::Primitive(PrimitiveType::Long),
                )),
                Arc::new(NestedField::optional(
                    2,
                    "name",
                    Type::Primitive(PrimitiveType::String),
                )),
            ])
            .build()
            .unwrap()
    }

    #[test]
    fn supported_conjuncts_convert_and_unsupported_ones_are_dropped() {
        let filters = [
            col("id").gt(lit(5i64)).and(col("name").like(lit("a%"))),
            col("name").eq(lit("x")),
        ];
        let p = to_iceberg_predicate(&filters, &schema())
            .unwrap()
            .to_string();
        assert!(p.contains("id > 5") && p.contains("name = \"x\""), "{p}");
        assert!(!p.contains("a%"), "{p}");
    }

    #[test]
    fn or_with_an_unconvertible_side_is_dropped_whole() {
        let filters = [col("id").eq(lit(1i64)).or(col("name").like(lit("a%")))];
        assert!(to_iceberg_predicate(&filters, &schema()).is_none());
    }
}
