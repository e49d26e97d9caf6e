//! Metadata for clients (DBeaver, ADBC, Superset): SqlInfo, XDBC type info, key-table
//! schemas, and the tables a session may see.

use arrow_flight::sql::metadata::{
    SqlInfoData, SqlInfoDataBuilder, XdbcTypeInfo, XdbcTypeInfoData, XdbcTypeInfoDataBuilder,
};
use arrow_flight::sql::{Nullable, Searchable, SqlInfo, XdbcDataType};
use clearice_engine::Session;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use std::sync::Arc;

use crate::service::ClearIceFlightSql;
use crate::wire::wire_schema;

pub(crate) fn sql_info_data() -> SqlInfoData {
    let mut b = SqlInfoDataBuilder::new();
    b.append(SqlInfo::FlightSqlServerName, "ClearIce");
    b.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
    b.append(SqlInfo::FlightSqlServerArrowVersion, "58");
    b.append(SqlInfo::FlightSqlServerReadOnly, false);
    b.append(SqlInfo::FlightSqlServerSql, true);
    b.append(SqlInfo::FlightSqlServerSubstrait, false);
    b.append(SqlInfo::FlightSqlServerTransaction, 0i32);
    b.append(SqlInfo::FlightSqlServerCancel, true);
    b.append(SqlInfo::FlightSqlServerStatementTimeout, 0i32);
    b.append(SqlInfo::FlightSqlServerTransactionTimeout, 0i32);
    b.append(SqlInfo::SqlDdlCatalog, false);
    b.append(SqlInfo::SqlDdlSchema, true);
    b.append(SqlInfo::SqlDdlTable, true);
    b.append(SqlInfo::SqlIdentifierCase, 1i32);
    b.append(SqlInfo::SqlIdentifierQuoteChar, "\"");
    b.append(SqlInfo::SqlQuotedIdentifierCase, 3i32);
    b.append(SqlInfo::SqlAllTablesAreSelectable, true);
    b.append(SqlInfo::SqlNullOrdering, 2i32);
    b.append(SqlInfo::SqlKeywords, &["EXPLAIN", "DESCRIBE"][..]);
    b.append(
        SqlInfo::SqlNumericFunctions,
        &["abs", "round", "floor", "ceil", "power", "sqrt"][..],
    );
    b.append(
        SqlInfo::SqlStringFunctions,
        &["lower", "upper", "substr", "trim", "length", "concat"][..],
    );
    b.append(SqlInfo::SqlSystemFunctions, &["version"][..]);
    b.append(
        SqlInfo::SqlDatetimeFunctions,
        &["now", "date_trunc", "date_part", "to_timestamp"][..],
    );
    b.append(SqlInfo::SqlSearchStringEscape, "\\");
    b.append(SqlInfo::SqlExtraNameCharacters, "");
    b.append(SqlInfo::SqlSupportsColumnAliasing, true);
    b.append(SqlInfo::SqlNullPlusNullIsNull, true);
    b.append(SqlInfo::SqlSupportsTableCorrelationNames, true);
    b.append(SqlInfo::SqlSupportsDifferentTableCorrelationNames, false);
    b.append(SqlInfo::SqlSupportsExpressionsInOrderBy, true);
    b.append(SqlInfo::SqlSupportsOrderByUnrelated, true);
    b.append(SqlInfo::SqlSupportedGroupBy, 3i32);
    b.append(SqlInfo::SqlSupportsLikeEscapeClause, true);
    b.append(SqlInfo::SqlSupportsNonNullableColumns, true);
    b.append(SqlInfo::SqlSupportedGrammar, 3i32);
    b.append(SqlInfo::SqlAnsi92SupportedLevel, 1i32);
    b.append(SqlInfo::SqlSupportsIntegrityEnhancementFacility, false);
    b.append(SqlInfo::SqlOuterJoinsSupportLevel, 2i32);
    b.append(SqlInfo::SqlSchemaTerm, "schema");
    b.append(SqlInfo::SqlProcedureTerm, "procedure");
    b.append(SqlInfo::SqlCatalogTerm, "catalog");
    b.append(SqlInfo::SqlCatalogAtStart, true);
    b.append(SqlInfo::SqlSchemasSupportedActions, 0i32);
    b.append(SqlInfo::SqlCatalogsSupportedActions, 0i32);
    b.append(SqlInfo::SqlSupportedPositionedCommands, 0i32);
    b.append(SqlInfo::SqlSelectForUpdateSupported, false);
    b.append(SqlInfo::SqlStoredProceduresSupported, false);
    b.append(SqlInfo::SqlSupportedSubqueries, 15i32);
    b.append(SqlInfo::SqlCorrelatedSubqueriesSupported, true);
    b.append(SqlInfo::SqlSupportedUnions, 3i32);
    // Limits ClearIce does not have (0: none or unknown).
    for unlimited in [
        SqlInfo::SqlMaxBinaryLiteralLength,
        SqlInfo::SqlMaxCharLiteralLength,
        SqlInfo::SqlMaxColumnNameLength,
        SqlInfo::SqlMaxColumnsInGroupBy,
        SqlInfo::SqlMaxColumnsInIndex,
        SqlInfo::SqlMaxColumnsInOrderBy,
        SqlInfo::SqlMaxColumnsInSelect,
        SqlInfo::SqlMaxColumnsInTable,
        SqlInfo::SqlMaxConnections,
        SqlInfo::SqlMaxCursorNameLength,
        SqlInfo::SqlMaxIndexLength,
        SqlInfo::SqlDbSchemaNameLength,
        SqlInfo::SqlMaxProcedureNameLength,
        SqlInfo::SqlMaxCatalogNameLength,
        SqlInfo::SqlMaxRowSize,
        SqlInfo::SqlMaxStatementLength,
        SqlInfo::SqlMaxStatements,
        SqlInfo::SqlMaxTableNameLength,
        SqlInfo::SqlMaxTablesInSelect,
        SqlInfo::SqlMaxUsernameLength,
    ] {
        b.append(unlimited, 0i64);
    }
    b.append(SqlInfo::SqlMaxRowSizeIncludesBlobs, true);
    b.append(SqlInfo::SqlDefaultTransactionIsolation, 0i64);
    b.append(SqlInfo::SqlTransactionsSupported, false);
    b.append(SqlInfo::SqlSupportedTransactionsIsolationLevels, 0i32);
    b.append(SqlInfo::SqlDataDefinitionCausesTransactionCommit, false);
    b.append(SqlInfo::SqlDataDefinitionsInTransactionsIgnored, true);
    b.append(SqlInfo::SqlSupportedResultSetTypes, 0i32);
    b.append(SqlInfo::SqlBatchUpdatesSupported, false);
    b.append(SqlInfo::SqlSavepointsSupported, false);
    b.append(SqlInfo::SqlNamedParametersSupported, false);
    b.append(SqlInfo::SqlLocatorsUpdateCopy, false);
    b.append(SqlInfo::SqlStoredFunctionsUsingCallSyntaxSupported, false);
    b.build().expect("static sql info")
}

pub(crate) fn xdbc_data() -> XdbcTypeInfoData {
    let mut b = XdbcTypeInfoDataBuilder::new();
    for (name, t, size) in [
        ("VARCHAR", XdbcDataType::XdbcVarchar, Some(i32::MAX)),
        ("BIGINT", XdbcDataType::XdbcBigint, Some(19)),
        ("INTEGER", XdbcDataType::XdbcInteger, Some(10)),
        ("DOUBLE", XdbcDataType::XdbcDouble, Some(15)),
        ("DECIMAL", XdbcDataType::XdbcDecimal, Some(38)),
        ("BOOLEAN", XdbcDataType::XdbcBit, Some(1)),
        ("DATE", XdbcDataType::XdbcDate, Some(10)),
        ("TIMESTAMP", XdbcDataType::XdbcTimestamp, Some(26)),
    ] {
        b.append(XdbcTypeInfo {
            type_name: name.into(),
            data_type: t,
            column_size: size,
            literal_prefix: None,
            literal_suffix: None,
            create_params: None,
            nullable: Nullable::NullabilityNullable,
            case_sensitive: name == "VARCHAR",
            searchable: Searchable::Full,
            unsigned_attribute: None,
            fixed_prec_scale: false,
            auto_increment: None,
            local_type_name: Some(name.into()),
            minimum_scale: None,
            maximum_scale: None,
            sql_data_type: t,
            datetime_subcode: None,
            num_prec_radix: None,
            interval_precision: None,
        });
    }
    b.build().expect("static xdbc info")
}

/// Key lookups: valid, empty results with the spec's schema (no keys in Iceberg tables).
pub(crate) fn keys_schema(cross: bool) -> SchemaRef {
    let s = |n: &str, nullable| Field::new(n, DataType::Utf8, nullable);
    let fields = if cross {
        vec![
            s("pk_catalog_name", true),
            s("pk_db_schema_name", true),
            s("pk_table_name", false),
            s("pk_column_name", false),
            s("fk_catalog_name", true),
            s("fk_db_schema_name", true),
            s("fk_table_name", false),
            s("fk_column_name", false),
            Field::new("key_sequence", DataType::Int32, false),
            s("fk_key_name", true),
            s("pk_key_name", true),
            Field::new("update_rule", DataType::UInt8, false),
            Field::new("delete_rule", DataType::UInt8, false),
        ]
    } else {
        vec![
            s("catalog_name", true),
            s("db_schema_name", true),
            s("table_name", false),
            s("column_name", false),
            Field::new("key_sequence", DataType::Int32, false),
            s("key_name", true),
        ]
    };
    Arc::new(Schema::new(fields))
}

impl ClearIceFlightSql {
    /// Tables the session may see: (catalog, schema, table, kind, schema).
    pub(crate) async fn table_list(
        &self,
        session: &Session,
    ) -> Vec<(String, String, String, String, SchemaRef)> {
        session.refresh_catalogs().await;
        let mut out = Vec::new();
        for c in session.catalog_names() {
            let Some(cat) = session.catalog(&c) else {
                continue;
            };
            for s in cat.schema_names() {
                let Some(schema) = cat.schema(&s) else {
                    continue;
                };
                for t in schema.table_names() {
                    // Tables the principal may not read (unknown principal) are not listed.
                    let Ok(Some(provider)) = schema.table(&t).await else {
                        continue;
                    };
                    let kind = if s == "information_schema" {
                        "VIEW"
                    } else {
                        "TABLE"
                    };
                    out.push((
                        c.clone(),
                        s.clone(),
                        t,
                        kind.to_owned(),
                        wire_schema(&provider.schema()),
                    ));
                }
            }
        }
        out
    }
}
