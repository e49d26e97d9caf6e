//! Result formats: table, csv, tsv, json, ndjson.

use anyhow::Result;
use datafusion::arrow::array::{Array, RecordBatch};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::util::pretty::pretty_format_batches;

/// Output format of query results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Boxed table (default in the REPL).
    Table,
    /// Comma-separated, with a header line.
    Csv,
    /// Tab-separated, with a header line.
    Tsv,
    /// One JSON array of row objects.
    Json,
    /// One JSON object per line.
    Ndjson,
}

/// Renders batches (all of one schema) in `format`.
pub fn render(schema: &SchemaRef, batches: &[RecordBatch], format: Format) -> Result<String> {
    let mut out = Vec::new();
    match format {
        Format::Table => {
            if batches.is_empty() {
                let empty = RecordBatch::new_empty(schema.clone());
                return Ok(format!("{}\n", pretty_format_batches(&[empty])?));
            }
            return Ok(format!("{}\n", pretty_format_batches(batches)?));
        }
        Format::Csv | Format::Tsv => {
            let delim = if format == Format::Csv { b',' } else { b'\t' };
            let mut w = datafusion::arrow::csv::WriterBuilder::new()
                .with_header(true)
                .with_delimiter(delim)
                .build(&mut out);
            if batches.is_empty() {
                w.write(&flatten_nested(&RecordBatch::new_empty(schema.clone()))?)?;
            }
            for b in batches {
                w.write(&flatten_nested(b)?)?;
            }
        }
        Format::Json => {
            let mut w = datafusion::arrow::json::ArrayWriter::new(&mut out);
            for b in batches {
                w.write(b)?;
            }
            w.finish()?;
            if batches.iter().all(|b| b.num_rows() == 0) {
                out = b"[]".to_vec();
            }
            out.push(b'\n');
        }
        Format::Ndjson => {
            let mut w = datafusion::arrow::json::LineDelimitedWriter::new(&mut out);
            for b in batches {
                w.write(b)?;
            }
            w.finish()?;
        }
    }
    Ok(String::from_utf8(out)?)
}

/// CSV cannot hold nested values: render lists, structs and maps as their display text.
fn flatten_nested(batch: &RecordBatch) -> Result<RecordBatch> {
    use datafusion::arrow::array::{ArrayRef, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
    use std::sync::Arc;
    if !batch
        .schema()
        .fields()
        .iter()
        .any(|f| f.data_type().is_nested())
    {
        return Ok(batch.clone());
    }
    let options = FormatOptions::default();
    let mut fields = Vec::new();
    let mut cols: Vec<ArrayRef> = Vec::new();
    for (f, c) in batch.schema().fields().iter().zip(batch.columns()) {
        if f.data_type().is_nested() {
            let fmt = ArrayFormatter::try_new(c.as_ref(), &options)?;
            let v: StringArray = (0..c.len())
                .map(|i| (!c.is_null(i)).then(|| fmt.value(i).to_string()))
                .collect();
            fields.push(Field::new(f.name(), DataType::Utf8, true));
            cols.push(Arc::new(v));
        } else {
            fields.push(f.as_ref().clone());
            cols.push(Arc::clone(c));
        }
    }
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), cols)?)
}
