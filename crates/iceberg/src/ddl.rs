//! The Iceberg side of catalog changes through SQL: `PARTITIONED BY` terms, Iceberg-
//! compatible column types, `ALTER TABLE` column operations. The policy's write rules
//! over them live in `clearice-access`.
//!
//! `PARTITIONED BY` arrives typed: [`crate::sql`] parses Spark's and Trino's clause into
//! the CreateTable's partition expression, and [`partition_terms`] reads it.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Schema as ArrowSchema, TimeUnit};
use datafusion::sql::sqlparser::ast::{
    Expr, FunctionArg, FunctionArgExpr, FunctionArguments, Value,
};
use iceberg::spec::Transform;

/// One change of `ALTER TABLE`.
#[derive(Debug, Clone)]
pub enum AlterColumn {
    /// `ADD COLUMN name type`.
    Add {
        /// Column name.
        name: String,
        /// Its type.
        data_type: DataType,
        /// `NULL` allowed (new columns must be).
        nullable: bool,
    },
    /// `DROP COLUMN [IF EXISTS] name`.
    Drop {
        /// Column name.
        name: String,
        /// No error if absent.
        if_exists: bool,
    },
    /// `RENAME COLUMN from TO to`.
    Rename {
        /// Current name.
        from: String,
        /// New name.
        to: String,
    },
}

/// One `PARTITIONED BY` term: a source column and a transform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionTerm {
    /// Source column.
    pub column: String,
    /// Iceberg transform.
    pub transform: Transform,
}

/// One argument of a partition transform.
enum Arg {
    Column(String),
    Number(u32),
}

/// The terms of a `PARTITIONED BY (region, days(ts), bucket(16, id), truncate(id, 4))`
/// clause (Spark's and Trino's names: `year`/`years`, `month`/`months`, `day`/`days`,
/// `hour`/`hours`, `bucket`, `truncate`, with the number first or last). Unquoted column
/// names are lower-cased, as DataFusion does.
pub fn partition_terms(clause: &Expr) -> Result<Vec<PartitionTerm>, String> {
    let items: Vec<&Expr> = match clause {
        Expr::Tuple(items) => items.iter().collect(),
        Expr::Nested(e) => vec![e.as_ref()],
        e => vec![e],
    };
    if items.is_empty() {
        return Err("PARTITIONED BY has no terms".into());
    }
    items.into_iter().map(term).collect()
}

fn column_of(e: &Expr) -> Option<String> {
    match e {
        Expr::Identifier(i) if i.quote_style.is_some() => Some(i.value.clone()),
        Expr::Identifier(i) => Some(i.value.to_lowercase()),
        _ => None,
    }
}

fn term(e: &Expr) -> Result<PartitionTerm, String> {
    if let Some(column) = column_of(e) {
        return Ok(PartitionTerm {
            column,
            transform: Transform::Identity,
        });
    }
    let Expr::Function(f) = e else {
        return Err(format!(
            "PARTITIONED BY term '{e}' is neither a column nor a transform of one"
        ));
    };
    let func = f.name.to_string().to_lowercase();
    let FunctionArguments::List(list) = &f.args else {
        return Err(format!("PARTITIONED BY {func} needs arguments"));
    };
    let args = list
        .args
        .iter()
        .map(|a| match a {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Value(v))) => match &v.value {
                Value::Number(n, _) => n.parse::<u32>().map(Arg::Number).ok(),
                _ => None,
            },
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => column_of(e).map(Arg::Column),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| format!("PARTITIONED BY {e}: arguments are a column and a number"))?;
    let one = |t: Transform| -> Result<PartitionTerm, String> {
        match args.as_slice() {
            [Arg::Column(c)] => Ok(PartitionTerm {
                column: c.clone(),
                transform: t,
            }),
            _ => Err(format!("PARTITIONED BY {func}(column) takes one column")),
        }
    };
    let with_n = |make: fn(u32) -> Transform| -> Result<PartitionTerm, String> {
        let (n, c) = match args.as_slice() {
            [Arg::Number(n), Arg::Column(c)] | [Arg::Column(c), Arg::Number(n)] => (*n, c),
            _ => {
                return Err(format!(
                    "PARTITIONED BY {func}(n, column) takes a number and a column"
                ));
            }
        };
        if n == 0 {
            return Err(format!(
                "PARTITIONED BY {func}: the number must be positive"
            ));
        }
        Ok(PartitionTerm {
            column: c.clone(),
            transform: make(n),
        })
    };
    match func.as_str() {
        "identity" => one(Transform::Identity),
        "year" | "years" => one(Transform::Year),
        "month" | "months" => one(Transform::Month),
        "day" | "days" | "date" => one(Transform::Day),
        "hour" | "hours" | "date_hour" => one(Transform::Hour),
        "bucket" => with_n(Transform::Bucket),
        "truncate" => with_n(Transform::Truncate),
        other => Err(format!(
            "PARTITIONED BY: unknown transform '{other}' (identity, year, month, day, hour, bucket, truncate)"
        )),
    }
}

/// An Arrow type Iceberg can hold (see [`iceberg_compatible`]).
pub fn iceberg_compatible_type(t: &DataType) -> DataType {
    iceberg_compatible(&ArrowSchema::new(vec![Field::new("c", t.clone(), true)]))
        .field(0)
        .data_type()
        .clone()
}

/// An Arrow schema Iceberg can hold: the types DataFusion produces mapped to Iceberg's
/// (views and large types to plain, small integers to int, timestamps to microseconds).
/// Nanoseconds too (DataFusion's `now()` and `CAST(... AS TIMESTAMP)`): `timestamp_ns` is a
/// format-3 type that Spark and Iceberg Java 1.x do not read; the write casts the values,
/// as PyIceberg does.
pub fn iceberg_compatible(schema: &ArrowSchema) -> ArrowSchema {
    fn ty(t: &DataType) -> DataType {
        match t {
            DataType::Utf8View | DataType::LargeUtf8 => DataType::Utf8,
            DataType::BinaryView | DataType::LargeBinary => DataType::Binary,
            DataType::Int8 | DataType::Int16 | DataType::UInt8 | DataType::UInt16 => {
                DataType::Int32
            }
            DataType::UInt32 => DataType::Int64,
            DataType::Float16 => DataType::Float32,
            DataType::Date64 => DataType::Date32,
            DataType::Timestamp(
                TimeUnit::Second | TimeUnit::Millisecond | TimeUnit::Nanosecond,
                tz,
            ) => DataType::Timestamp(TimeUnit::Microsecond, tz.clone()),
            DataType::Dictionary(_, v) => ty(v),
            // inside nested types too (`[now()]`, `named_struct('t', now())`)
            DataType::List(f) => DataType::List(field(f)),
            DataType::LargeList(f) => DataType::LargeList(field(f)),
            DataType::FixedSizeList(f, n) => DataType::FixedSizeList(field(f), *n),
            DataType::Struct(fs) => DataType::Struct(fs.iter().map(field).collect()),
            DataType::Map(f, sorted) => DataType::Map(field(f), *sorted),
            other => other.clone(),
        }
    }
    fn field(f: &FieldRef) -> FieldRef {
        Arc::new(f.as_ref().clone().with_data_type(ty(f.data_type())))
    }
    ArrowSchema::new(
        schema
            .fields()
            .iter()
            .map(|f| Field::new(f.name(), ty(f.data_type()), f.is_nullable()))
            .collect::<Vec<_>>(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::parser::Parser;

    fn terms(text: &str) -> Result<Vec<PartitionTerm>, String> {
        let e = Parser::new(&GenericDialect {})
            .try_with_sql(text)
            .and_then(|mut p| p.parse_expr())
            .unwrap();
        partition_terms(&e)
    }

    #[test]
    fn timestamps_of_every_unit_become_microseconds() {
        for unit in [
            TimeUnit::Second,
            TimeUnit::Millisecond,
            TimeUnit::Microsecond,
            TimeUnit::Nanosecond,
        ] {
            for tz in [None, Some("+00:00".into())] {
                assert_eq!(
                    iceberg_compatible_type(&DataType::Timestamp(unit, tz.clone())),
                    DataType::Timestamp(TimeUnit::Microsecond, tz)
                );
            }
        }
    }

    #[test]
    fn nested_nanosecond_timestamps_become_microseconds() {
        let ns = DataType::Timestamp(TimeUnit::Nanosecond, None);
        let us = DataType::Timestamp(TimeUnit::Microsecond, None);
        let item = |t: &DataType| Arc::new(Field::new("item", t.clone(), true));
        let list = |t: &DataType| DataType::List(item(t));
        let strukt = |t: &DataType| DataType::Struct(vec![Field::new("t", list(t), true)].into());
        assert_eq!(iceberg_compatible_type(&strukt(&ns)), strukt(&us));
        let map = |t: &DataType| {
            DataType::Map(
                Arc::new(Field::new(
                    "entries",
                    DataType::Struct(
                        vec![
                            Field::new("key", DataType::Utf8, false),
                            Field::new("value", t.clone(), true),
                        ]
                        .into(),
                    ),
                    false,
                )),
                false,
            )
        };
        assert_eq!(iceberg_compatible_type(&map(&ns)), map(&us));
    }

    #[test]
    fn partition_terms_parse_spark_and_trino_forms() {
        let t =
            terms("(region, days(ts), bucket(16, id), truncate(Name, 4), year(d), \"Q\")").unwrap();
        assert_eq!(
            t.iter().map(|t| t.transform).collect::<Vec<_>>(),
            vec![
                Transform::Identity,
                Transform::Day,
                Transform::Bucket(16),
                Transform::Truncate(4),
                Transform::Year,
                Transform::Identity,
            ]
        );
        assert_eq!(t[3].column, "name");
        assert_eq!(t[5].column, "Q");
        assert_eq!(terms("(id)").unwrap()[0].column, "id");
        assert!(
            terms("(zorder(a))")
                .unwrap_err()
                .contains("unknown transform")
        );
        assert!(terms("(bucket(id))").is_err());
        assert!(terms("(bucket(0, id))").unwrap_err().contains("positive"));
        assert!(terms("(a + 1)").unwrap_err().contains("neither a column"));
    }
}
