//! Iceberg schema to the Arrow schema ClearIce exposes to SQL.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use crate::error::{Error, Result};

/// Arrow schema of an Iceberg schema, fields carrying `PARQUET:field_id`. Top-level
/// strings and binaries are view types, as DataFusion's Parquet reader produces them,
/// so scans need no per-batch cast.
pub fn arrow_schema(table: &str, schema: &iceberg::spec::Schema) -> Result<SchemaRef> {
    let arrow =
        iceberg::arrow::schema_to_arrow_schema(schema).map_err(|source| Error::Iceberg {
            table: table.into(),
            source: Box::new(source),
        })?;
    let fields: Vec<Field> = arrow
        .fields()
        .iter()
        .map(|f| {
            let dt = match f.data_type() {
                DataType::Utf8 | DataType::LargeUtf8 => DataType::Utf8View,
                DataType::Binary | DataType::LargeBinary => DataType::BinaryView,
                other => other.clone(),
            };
            f.as_ref().clone().with_data_type(dt)
        })
        .collect();
    Ok(Arc::new(Schema::new_with_metadata(
        fields,
        arrow.metadata().clone(),
    )))
}
