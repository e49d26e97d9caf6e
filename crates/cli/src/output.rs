//! Result formats: table, csv, tsv, json, ndjson, written batch by batch.
//!
//! The streaming formats (csv, tsv, json, ndjson) write each batch as it arrives, so a
//! result of any size is exported in bounded memory. The table format keeps at most
//! `max_rows` rows (the shell's limit) and reports how many more there were.

use std::io::Write;
use std::sync::Arc;

use anyhow::Result;
use datafusion::arrow::array::{ArrayRef, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::json::writer::{EncoderOptions, JsonArray, LineDelimited, make_encoder};
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

enum Sink<W: Write> {
    Table {
        out: W,
        kept: Vec<RecordBatch>,
        kept_rows: usize,
        max_rows: usize,
    },
    Csv(Box<datafusion::arrow::csv::Writer<W>>),
    Json(datafusion::arrow::json::Writer<W, JsonArray>),
    Ndjson(datafusion::arrow::json::Writer<W, LineDelimited>),
}

/// Writes one result, batch by batch, in a format.
pub struct BatchWriter<W: Write> {
    schema: SchemaRef,
    sink: Sink<W>,
    rows: usize,
}

impl<W: Write> BatchWriter<W> {
    /// A writer of results with `schema`; `max_rows` bounds the rows the table format
    /// shows (the others are counted).
    pub fn new(out: W, schema: SchemaRef, format: Format, max_rows: usize) -> Self {
        let sink = match format {
            Format::Table => Sink::Table {
                out,
                kept: Vec::new(),
                kept_rows: 0,
                max_rows,
            },
            Format::Csv | Format::Tsv => Sink::Csv(Box::new(
                datafusion::arrow::csv::WriterBuilder::new()
                    .with_header(true)
                    .with_delimiter(if format == Format::Csv { b',' } else { b'\t' })
                    .build(out),
            )),
            Format::Json => Sink::Json(datafusion::arrow::json::ArrayWriter::new(out)),
            Format::Ndjson => Sink::Ndjson(datafusion::arrow::json::LineDelimitedWriter::new(out)),
        };
        Self {
            schema,
            sink,
            rows: 0,
        }
    }

    /// Writes one batch.
    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        self.rows += batch.num_rows();
        match &mut self.sink {
            Sink::Table {
                kept,
                kept_rows,
                max_rows,
                ..
            } => {
                let room = max_rows.saturating_sub(*kept_rows);
                if room > 0 && batch.num_rows() > 0 {
                    let b = batch.slice(0, room.min(batch.num_rows()));
                    *kept_rows += b.num_rows();
                    kept.push(b);
                }
            }
            Sink::Csv(w) => w.write(&nested_as_json(batch)?)?,
            Sink::Json(w) => w.write(batch)?,
            Sink::Ndjson(w) => w.write(batch)?,
        }
        Ok(())
    }

    /// Finishes the output; returns the total row count.
    pub fn finish(self) -> Result<usize> {
        match self.sink {
            Sink::Table {
                mut out,
                kept,
                kept_rows,
                ..
            } => {
                let shown = if kept.is_empty() {
                    vec![RecordBatch::new_empty(Arc::clone(&self.schema))]
                } else {
                    kept
                };
                writeln!(out, "{}", pretty_format_batches(&shown)?)?;
                if self.rows > kept_rows {
                    let more = self.rows - kept_rows;
                    writeln!(
                        out,
                        "({more} more row{} not shown; --format csv or a LIMIT shows them)",
                        if more == 1 { "" } else { "s" }
                    )?;
                }
                out.flush()?;
            }
            Sink::Csv(mut w) => {
                if self.rows == 0 {
                    // The header line.
                    w.write(&nested_as_json(&RecordBatch::new_empty(Arc::clone(
                        &self.schema,
                    )))?)?;
                }
                w.into_inner().flush()?;
            }
            Sink::Json(mut w) => {
                w.finish()?;
                let mut out = w.into_inner();
                if self.rows == 0 {
                    out.write_all(b"[]")?;
                }
                out.write_all(b"\n")?;
                out.flush()?;
            }
            Sink::Ndjson(mut w) => {
                w.finish()?;
                w.into_inner().flush()?;
            }
        }
        Ok(self.rows)
    }
}

/// Renders batches (all of one schema) in `format`, with no row limit.
pub fn render(schema: &SchemaRef, batches: &[RecordBatch], format: Format) -> Result<String> {
    let mut out = Vec::new();
    let mut w = BatchWriter::new(&mut out, Arc::clone(schema), format, usize::MAX);
    for b in batches {
        w.write(b)?;
    }
    w.finish()?;
    Ok(String::from_utf8(out)?)
}

/// CSV cannot hold nested values: lists, structs and maps are written as JSON text.
fn nested_as_json(batch: &RecordBatch) -> Result<RecordBatch> {
    if !batch
        .schema()
        .fields()
        .iter()
        .any(|f| f.data_type().is_nested())
    {
        return Ok(batch.clone());
    }
    let options = EncoderOptions::default();
    let mut fields = Vec::new();
    let mut cols: Vec<ArrayRef> = Vec::new();
    for (f, c) in batch.schema().fields().iter().zip(batch.columns()) {
        if f.data_type().is_nested() {
            let mut enc = make_encoder(f, c.as_ref(), &options)?;
            let mut buf = Vec::new();
            let v: StringArray = (0..c.len())
                .map(|i| {
                    if enc.is_null(i) {
                        return Ok(None);
                    }
                    buf.clear();
                    enc.encode(i, &mut buf);
                    Ok(Some(String::from_utf8(buf.clone())?))
                })
                .collect::<Result<_>>()?;
            fields.push(Field::new(f.name(), DataType::Utf8, true));
            cols.push(Arc::new(v));
        } else {
            fields.push(f.as_ref().clone());
            cols.push(Arc::clone(c));
        }
    }
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), cols)?)
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests may block")]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int32Array, ListArray};
    use datafusion::arrow::datatypes::Int32Type;

    fn batch(n: i32) -> RecordBatch {
        let ids = Int32Array::from_iter_values(0..n);
        let tags = ListArray::from_iter_primitive::<Int32Type, _, _>(
            (0..n).map(|i| (i % 2 == 0).then(|| vec![Some(i), None])),
        );
        RecordBatch::try_from_iter([
            ("id", Arc::new(ids) as ArrayRef),
            ("tags", Arc::new(tags) as ArrayRef),
        ])
        .unwrap()
    }

    #[test]
    fn nested_columns_are_json_text_in_csv() {
        let b = batch(2);
        let text = render(&b.schema(), &[b], Format::Csv).unwrap();
        assert_eq!(text, "id,tags\n0,\"[0,null]\"\n1,\n");
    }

    #[test]
    fn table_keeps_max_rows_and_counts_the_rest() {
        let b = batch(10);
        let mut out = Vec::new();
        let mut w = BatchWriter::new(&mut out, b.schema(), Format::Table, 3);
        w.write(&b).unwrap();
        w.write(&b).unwrap();
        assert_eq!(w.finish().unwrap(), 20);
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text.lines().filter(|l| l.starts_with("| ")).count(),
            4,
            "{text}"
        );
        assert!(text.contains("(17 more rows not shown"), "{text}");
    }
}
