//! Column resolution by Iceberg field id (`PARQUET:field_id`), not by name, so renamed
//! columns read right and columns added after a file was written read as NULL.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::error::Result;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr_adapter::{
    DefaultPhysicalExprAdapterFactory, PhysicalExprAdapter, PhysicalExprAdapterFactory,
};
use parquet::arrow::PARQUET_FIELD_ID_META_KEY;

/// Field id of an Arrow field, from its `PARQUET:field_id` metadata.
pub fn field_id(field: &Field) -> Option<i32> {
    field
        .metadata()
        .get(PARQUET_FIELD_ID_META_KEY)?
        .parse()
        .ok()
}

/// Adapts table-schema expressions to each file's schema, matching fields by id.
#[derive(Debug, Default)]
pub struct FieldIdExprAdapterFactory;

impl PhysicalExprAdapterFactory for FieldIdExprAdapterFactory {
    fn create(
        &self,
        logical: SchemaRef,
        physical: SchemaRef,
    ) -> Result<Arc<dyn PhysicalExprAdapter>> {
        let by_id: HashMap<i32, &str> = logical
            .fields()
            .iter()
            .filter_map(|f| Some((field_id(f)?, f.name().as_str())))
            .collect();
        let has_ids = physical.fields().iter().any(|f| field_id(f).is_some());
        // Files without field ids (not written for Iceberg) resolve by name.
        let renamed = if has_ids && !by_id.is_empty() {
            let fields: Vec<Field> = physical
                .fields()
                .iter()
                .enumerate()
                .map(|(i, f)| {
                    let name = match field_id(f).and_then(|id| by_id.get(&id)) {
                        Some(name) => (*name).to_owned(),
                        None => format!("__clearice_unmapped_{i}"),
                    };
                    f.as_ref().clone().with_name(name)
                })
                .collect();
            Arc::new(Schema::new_with_metadata(
                fields,
                physical.metadata().clone(),
            ))
        } else {
            Arc::clone(&physical)
        };
        let inner = DefaultPhysicalExprAdapterFactory.create(logical, Arc::clone(&renamed))?;
        Ok(Arc::new(FieldIdExprAdapter { inner, physical }))
    }
}

#[derive(Debug)]
struct FieldIdExprAdapter {
    inner: Arc<dyn PhysicalExprAdapter>,
    physical: SchemaRef,
}

impl PhysicalExprAdapter for FieldIdExprAdapter {
    fn rewrite(&self, expr: Arc<dyn PhysicalExpr>) -> Result<Arc<dyn PhysicalExpr>> {
        let expr = self.inner.rewrite(expr)?;
        // The inner adapter resolved columns against the renamed schema: put back the
        // file's own names (the reader projects and rebases by name).
        expr.transform(|e| {
            if let Some(c) = e.as_any().downcast_ref::<Column>()
                && let Some(f) = self.physical.fields().get(c.index())
                && f.name() != c.name()
            {
                return Ok(Transformed::yes(
                    Arc::new(Column::new(f.name(), c.index())) as _
                ));
            }
            Ok(Transformed::no(e))
        })
        .data()
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests may block")]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::DataType;

    fn f(name: &str, id: i32) -> Field {
        Field::new(name, DataType::Int64, true).with_metadata(HashMap::from([(
            PARQUET_FIELD_ID_META_KEY.to_string(),
            id.to_string(),
        )]))
    }

    #[test]
    fn renamed_column_resolves_to_the_files_column_by_id() {
        let logical = Arc::new(Schema::new(vec![f("a", 1), f("renamed", 2)]));
        let physical = Arc::new(Schema::new(vec![f("old_name", 2), f("a", 1)]));
        let adapter = FieldIdExprAdapterFactory.create(logical, physical).unwrap();
        let out = adapter
            .rewrite(Arc::new(Column::new("renamed", 1)))
            .unwrap();
        let c = out.as_any().downcast_ref::<Column>().expect("plain column");
        assert_eq!((c.name(), c.index()), ("old_name", 0));
    }

    #[test]
    fn column_missing_from_file_becomes_null() {
        let logical = Arc::new(Schema::new(vec![f("a", 1), f("added", 3)]));
        let physical = Arc::new(Schema::new(vec![f("a", 1)]));
        let adapter = FieldIdExprAdapterFactory.create(logical, physical).unwrap();
        let out = adapter.rewrite(Arc::new(Column::new("added", 1))).unwrap();
        assert!(out.as_any().downcast_ref::<Column>().is_none(), "{out}");
        assert!(out.to_string().contains("NULL"), "{out}");
    }

    #[test]
    fn dropped_then_readded_name_does_not_read_the_old_column() {
        // file has "x" with id 5 (dropped); table has a new "x" with id 6
        let logical = Arc::new(Schema::new(vec![f("x", 6)]));
        let physical = Arc::new(Schema::new(vec![f("x", 5)]));
        let adapter = FieldIdExprAdapterFactory.create(logical, physical).unwrap();
        let out = adapter.rewrite(Arc::new(Column::new("x", 0))).unwrap();
        assert!(out.to_string().contains("NULL"), "{out}");
    }
}
