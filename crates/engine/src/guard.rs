//! What stands between DataFusion and a statement's caller: a panic inside DataFusion
//! becomes an error of the statement, and a stream carries the column types its plan
//! announced.

use std::sync::Arc;

use clearice_access::one_line;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SendableRecordBatchStream;

/// `f`, with a panic inside it (a DataFusion bug: some plans panic instead of failing)
/// turned into an error of the statement: one line, audited like any other, and the
/// session, connection and process go on.
pub(crate) async fn contained<T>(f: impl Future<Output = Result<T>>) -> Result<T> {
    use futures::FutureExt as _;
    // Boxed: statement futures are large, and a test's or a front end's stack is not.
    std::panic::AssertUnwindSafe(Box::pin(f))
        .catch_unwind()
        .await
        .unwrap_or_else(|p| Err(panic_error(p.as_ref())))
}

/// The error a panic inside a statement becomes.
pub(crate) fn panic_error(payload: &(dyn std::any::Any + Send)) -> DataFusionError {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_owned());
    let what: String = one_line(&what).chars().take(300).collect();
    DataFusionError::Internal(format!(
        "the query engine failed on this statement (an internal DataFusion error): {what}"
    ))
}

/// `stream` with the column types the statement's plan announced (what Flight SQL's
/// `GetFlightInfo` sends): DataFusion's physical plan can type a column differently from
/// its logical plan (`sum` of a DECIMAL next to `count(DISTINCT)`: decimal(32, 2) where
/// the plan says decimal(22, 2)), and a client that checks the stream against the schema
/// it was given fails. A decimal column whose precision differs is cast (same scale: an
/// overflowing value is an error, never a changed value); other differences are left as
/// they are.
pub(crate) fn with_types_of(
    announced: &SchemaRef,
    stream: SendableRecordBatchStream,
) -> Result<SendableRecordBatchStream> {
    use datafusion::arrow::compute::{CastOptions, cast_with_options};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
    use futures::StreamExt as _;
    let actual = stream.schema();
    // Only a decimal's precision is changed (same scale: the value is the same, or the
    // cast fails on overflow); any other difference is left as DataFusion produced it.
    let same_value = |a: &DataType, b: &DataType| match (a, b) {
        (DataType::Decimal128(_, s), DataType::Decimal128(_, t))
        | (DataType::Decimal256(_, s), DataType::Decimal256(_, t)) => s == t,
        _ => false,
    };
    if actual.fields().len() != announced.fields().len()
        || actual
            .fields()
            .iter()
            .zip(announced.fields())
            .all(|(a, b)| {
                a.data_type() == b.data_type() || !same_value(a.data_type(), b.data_type())
            })
    {
        return Ok(stream);
    }
    let fields: Vec<Field> = actual
        .fields()
        .iter()
        .zip(announced.fields())
        .map(|(a, b)| match same_value(a.data_type(), b.data_type()) {
            true => a.as_ref().clone().with_data_type(b.data_type().clone()),
            false => a.as_ref().clone(),
        })
        .collect();
    let schema: SchemaRef = Arc::new(Schema::new_with_metadata(fields, actual.metadata().clone()));
    let out = Arc::clone(&schema);
    let options = CastOptions {
        safe: false,
        ..Default::default()
    };
    let batches = stream.map(move |batch| {
        let batch = batch?;
        let columns = batch
            .columns()
            .iter()
            .zip(out.fields())
            .map(|(c, f)| {
                if c.data_type() == f.data_type() {
                    Ok(Arc::clone(c))
                } else {
                    cast_with_options(c, f.data_type(), &options)
                }
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(RecordBatch::try_new(Arc::clone(&out), columns)?)
    });
    Ok(Box::pin(RecordBatchStreamAdapter::new(schema, batches)))
}
