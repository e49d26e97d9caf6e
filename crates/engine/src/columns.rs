//! What a Flight SQL client is told about result columns: the table each one comes from
//! and its SQL type, as Flight SQL's column metadata (`ARROW:FLIGHT:SQL:*` field
//! metadata, read by the JDBC driver's `ResultSetMetaData` and by ADBC).
//!
//! Only what the statement itself shows is described: a column read as it is from a
//! table (directly or through an alias of it) names that table; anything computed names
//! none. Types are those of the result, so a masked column is described as what the
//! principal receives.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{ResolvedTableReference, TableReference};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;

/// Flight SQL's metadata keys (Flight SQL's `CommandStatementQuery` documentation).
mod key {
    pub const CATALOG: &str = "ARROW:FLIGHT:SQL:CATALOG_NAME";
    pub const SCHEMA: &str = "ARROW:FLIGHT:SQL:DB_SCHEMA_NAME";
    /// The key the JDBC driver reads (arrow-java's `FlightSqlColumnMetadata`).
    pub const SCHEMA_JDBC: &str = "ARROW:FLIGHT:SQL:SCHEMA_NAME";
    pub const TABLE: &str = "ARROW:FLIGHT:SQL:TABLE_NAME";
    pub const TYPE_NAME: &str = "ARROW:FLIGHT:SQL:TYPE_NAME";
    pub const PRECISION: &str = "ARROW:FLIGHT:SQL:PRECISION";
    pub const SCALE: &str = "ARROW:FLIGHT:SQL:SCALE";
    pub const AUTO_INCREMENT: &str = "ARROW:FLIGHT:SQL:IS_AUTO_INCREMENT";
    pub const CASE_SENSITIVE: &str = "ARROW:FLIGHT:SQL:IS_CASE_SENSITIVE";
    pub const READ_ONLY: &str = "ARROW:FLIGHT:SQL:IS_READ_ONLY";
    pub const SEARCHABLE: &str = "ARROW:FLIGHT:SQL:IS_SEARCHABLE";
}

/// The result schema of `plan` with each column described; `catalog` and `schema` are
/// the session's defaults, which complete partial table names; only tables of `catalogs`
/// (the Iceberg catalogs) are named.
pub(crate) fn described(
    plan: &LogicalPlan,
    catalog: &str,
    schema: &str,
    catalogs: &[&str],
) -> SchemaRef {
    let tables = tables_of(plan, catalog, schema, catalogs);
    let out = plan.schema();
    let fields: Vec<Field> = out
        .iter()
        .map(|(qualifier, field)| {
            let origin = qualifier.and_then(|q| tables.get(q));
            let mut metadata = field.metadata().clone();
            metadata.extend(column_metadata(field.data_type(), origin));
            field.as_ref().clone().with_metadata(metadata)
        })
        .collect();
    Arc::new(Schema::new_with_metadata(
        fields,
        out.as_arrow().metadata().clone(),
    ))
}

/// The tables a column qualifier of `plan` may stand for: each catalog table read, under
/// the name it was written with and under an alias given to it directly (`FROM t AS c`).
fn tables_of(
    plan: &LogicalPlan,
    catalog: &str,
    schema: &str,
    catalogs: &[&str],
) -> HashMap<TableReference, ResolvedTableReference> {
    let mut tables: HashMap<TableReference, Option<ResolvedTableReference>> = HashMap::new();
    // A name that stands for two things (two tables, or a table and a subquery's alias)
    // names none: its columns may come from either.
    let mut add = |name: &TableReference, table: Option<ResolvedTableReference>| {
        let entry = tables.entry(name.clone()).or_insert_with(|| table.clone());
        if *entry != table {
            *entry = None;
        }
    };
    let resolved = |t: &TableReference| {
        let r = t.clone().resolve(catalog, schema);
        (catalogs.contains(&r.catalog.as_ref()) && r.schema.as_ref() != "information_schema")
            .then_some(r)
    };
    let _ = plan.apply_with_subqueries(|node| {
        match node {
            LogicalPlan::TableScan(scan) => add(&scan.table_name, resolved(&scan.table_name)),
            LogicalPlan::SubqueryAlias(a) => match a.input.as_ref() {
                LogicalPlan::TableScan(scan) => add(&a.alias, resolved(&scan.table_name)),
                _ => add(&a.alias, None),
            },
            _ => {}
        }
        Ok(TreeNodeRecursion::Continue)
    });
    tables
        .into_iter()
        .filter_map(|(name, table)| Some((name, table?)))
        .collect()
}

/// `stream` with its schema's columns described as in `described` (the same columns,
/// from the logical plan); the batches are left as they are.
pub(crate) fn describe_stream(
    stream: SendableRecordBatchStream,
    described: &Schema,
) -> SendableRecordBatchStream {
    let actual = stream.schema();
    if actual.fields().len() != described.fields().len() {
        return stream;
    }
    let fields: Vec<Field> = actual
        .fields()
        .iter()
        .zip(described.fields())
        .map(|(a, d)| {
            let mut metadata = a.metadata().clone();
            metadata.extend(d.metadata().clone());
            a.as_ref().clone().with_metadata(metadata)
        })
        .collect();
    let schema = Arc::new(Schema::new_with_metadata(fields, actual.metadata().clone()));
    Box::pin(RecordBatchStreamAdapter::new(schema, stream))
}

/// Flight SQL's metadata of one column of type `dt`, read from `table` if known.
fn column_metadata(dt: &DataType, table: Option<&ResolvedTableReference>) -> Vec<(String, String)> {
    let mut m: Vec<(&str, String)> = Vec::new();
    if let Some(t) = table {
        m.push((key::CATALOG, t.catalog.to_string()));
        m.push((key::SCHEMA, t.schema.to_string()));
        m.push((key::SCHEMA_JDBC, t.schema.to_string()));
        m.push((key::TABLE, t.table.to_string()));
    }
    m.push((key::TYPE_NAME, type_name(dt).to_owned()));
    if let Some((precision, scale)) = precision_scale(dt) {
        m.push((key::PRECISION, precision.to_string()));
        if let Some(s) = scale {
            m.push((key::SCALE, s.to_string()));
        }
    }
    let text = matches!(
        dt,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    );
    m.push((key::AUTO_INCREMENT, "0".into()));
    m.push((key::CASE_SENSITIVE, if text { "1" } else { "0" }.into()));
    m.push((key::READ_ONLY, "1".into()));
    m.push((key::SEARCHABLE, "1".into()));
    m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// The SQL name of a type, as DataFusion's SQL spells it.
fn type_name(dt: &DataType) -> &'static str {
    match dt {
        DataType::Null => "NULL",
        DataType::Boolean => "BOOLEAN",
        DataType::Int8 => "TINYINT",
        DataType::Int16 => "SMALLINT",
        DataType::Int32 => "INTEGER",
        DataType::Int64 => "BIGINT",
        DataType::UInt8 => "TINYINT UNSIGNED",
        DataType::UInt16 => "SMALLINT UNSIGNED",
        DataType::UInt32 => "INTEGER UNSIGNED",
        DataType::UInt64 => "BIGINT UNSIGNED",
        DataType::Float16 | DataType::Float32 => "REAL",
        DataType::Float64 => "DOUBLE",
        DataType::Decimal32(..)
        | DataType::Decimal64(..)
        | DataType::Decimal128(..)
        | DataType::Decimal256(..) => "DECIMAL",
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "VARCHAR",
        DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_) => "VARBINARY",
        DataType::Date32 | DataType::Date64 => "DATE",
        DataType::Time32(_) | DataType::Time64(_) => "TIME",
        DataType::Timestamp(_, None) => "TIMESTAMP",
        DataType::Timestamp(_, Some(_)) => "TIMESTAMP WITH TIME ZONE",
        DataType::Duration(_) | DataType::Interval(_) => "INTERVAL",
        DataType::List(_)
        | DataType::LargeList(_)
        | DataType::ListView(_)
        | DataType::LargeListView(_)
        | DataType::FixedSizeList(..) => "ARRAY",
        DataType::Struct(_) => "STRUCT",
        DataType::Map(..) => "MAP",
        DataType::Union(..) => "UNION",
        DataType::Dictionary(_, v) => type_name(v),
        DataType::RunEndEncoded(_, v) => type_name(v.data_type()),
    }
}

/// Precision (digits) and scale of numeric types, as JDBC reports them.
fn precision_scale(dt: &DataType) -> Option<(u32, Option<i32>)> {
    Some(match dt {
        DataType::Int8 | DataType::UInt8 => (3, Some(0)),
        DataType::Int16 | DataType::UInt16 => (5, Some(0)),
        DataType::Int32 | DataType::UInt32 => (10, Some(0)),
        DataType::Int64 => (19, Some(0)),
        DataType::UInt64 => (20, Some(0)),
        DataType::Float32 => (7, None),
        DataType::Float64 => (15, None),
        DataType::Decimal32(p, s) | DataType::Decimal64(p, s) => (u32::from(*p), Some(*s as i32)),
        DataType::Decimal128(p, s) | DataType::Decimal256(p, s) => {
            (u32::from(*p), Some(i32::from(*s)))
        }
        DataType::Dictionary(_, v) => return precision_scale(v),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    fn meta<'a>(schema: &'a Schema, column: &str, key: &str) -> Option<&'a str> {
        schema
            .field_with_name(column)
            .unwrap()
            .metadata()
            .get(key)
            .map(String::as_str)
    }

    /// Columns read as they are name their table (also through an alias); computed or
    /// renamed ones name none; decimals carry their precision and scale.
    #[tokio::test]
    async fn columns_name_their_table_and_type() {
        let ctx = SessionContext::new();
        ctx.sql("CREATE TABLE t (id BIGINT, amount DECIMAL(12, 2), name VARCHAR) AS VALUES (1, 2.5, 'a')")
            .await
            .unwrap();
        let plan = ctx
            .sql("SELECT c.id, c.amount, upper(c.name) AS shout, c.name AS renamed FROM t AS c")
            .await
            .unwrap()
            .into_unoptimized_plan();
        let s = described(&plan, "datafusion", "public", &["datafusion"]);
        assert_eq!(meta(&s, "id", key::TABLE), Some("t"));
        assert_eq!(meta(&s, "id", key::CATALOG), Some("datafusion"));
        assert_eq!(meta(&s, "id", key::SCHEMA), Some("public"));
        assert_eq!(meta(&s, "id", key::TYPE_NAME), Some("BIGINT"));
        assert_eq!(meta(&s, "amount", key::TYPE_NAME), Some("DECIMAL"));
        assert_eq!(meta(&s, "amount", key::PRECISION), Some("12"));
        assert_eq!(meta(&s, "amount", key::SCALE), Some("2"));
        assert_eq!(meta(&s, "shout", key::TABLE), None);
        assert_eq!(meta(&s, "shout", key::TYPE_NAME), Some("VARCHAR"));
        assert_eq!(meta(&s, "shout", key::CASE_SENSITIVE), Some("1"));
        assert_eq!(meta(&s, "renamed", key::TABLE), None);
        // A subquery aliased like a table it reads: its columns name no table.
        let plan = ctx
            .sql("SELECT t.id FROM (SELECT id * 2 AS id FROM t) AS t")
            .await
            .unwrap()
            .into_unoptimized_plan();
        let s = described(&plan, "datafusion", "public", &["datafusion"]);
        assert_eq!(meta(&s, "id", key::TABLE), None);
        // A name given to two tables names neither; tables of other catalogs are not named.
        ctx.sql("CREATE TABLE u (id BIGINT) AS VALUES (1)")
            .await
            .unwrap();
        let plan = ctx
            .sql("SELECT u.id FROM t AS u JOIN u AS v ON u.id = v.id")
            .await
            .unwrap()
            .into_unoptimized_plan();
        let s = described(&plan, "datafusion", "public", &["datafusion"]);
        assert_eq!(meta(&s, "id", key::TABLE), None);
        let plan = ctx
            .sql("SELECT id FROM t")
            .await
            .unwrap()
            .into_unoptimized_plan();
        let s = described(&plan, "datafusion", "public", &["lake"]);
        assert_eq!(meta(&s, "id", key::TABLE), None);
        assert_eq!(meta(&s, "id", key::TYPE_NAME), Some("BIGINT"));
    }
}
