//! Results on the wire: view types cast for clients that cannot read them, schemas as
//! IPC bytes, FlightInfo with the command as its ticket, one-batch result streams, and
//! `DoPut` data read under a byte cap.

use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::sql::Any;
use arrow_flight::{
    FlightData, FlightDescriptor, FlightEndpoint, FlightInfo, IpcMessage, SchemaAsIpc, Ticket,
};
use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::ipc::writer::IpcWriteOptions;
use datafusion::error::DataFusionError;
use futures::{Stream, StreamExt, TryStreamExt};
use prost::Message;
use std::pin::Pin;
use std::sync::Arc;
use tonic::Status;

pub(crate) type DoGetStream =
    Pin<Box<dyn Stream<Item = Result<FlightData, Status>> + Send + 'static>>;

/// View types are cast at the boundary: JDBC driver 18.x cannot read them.
pub(crate) fn wire_type(dt: &DataType) -> DataType {
    match dt {
        DataType::Utf8View => DataType::Utf8,
        DataType::BinaryView => DataType::Binary,
        other => other.clone(),
    }
}

pub(crate) fn wire_schema(schema: &Schema) -> SchemaRef {
    Arc::new(Schema::new_with_metadata(
        schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_data_type(wire_type(f.data_type())))
            .collect::<Vec<Field>>(),
        schema.metadata().clone(),
    ))
}

pub(crate) fn wire_batch(
    batch: RecordBatch,
    schema: &SchemaRef,
) -> Result<RecordBatch, DataFusionError> {
    let cols: Vec<ArrayRef> = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| {
            if c.data_type() == f.data_type() {
                Ok(Arc::clone(c))
            } else {
                cast(c, f.data_type())
            }
        })
        .collect::<Result<_, _>>()?;
    Ok(RecordBatch::try_new(Arc::clone(schema), cols)?)
}

pub(crate) fn schema_bytes(schema: &Schema) -> Result<prost::bytes::Bytes, Status> {
    let IpcMessage(bytes) = SchemaAsIpc::new(schema, &IpcWriteOptions::default())
        .try_into()
        .map_err(|e: datafusion::arrow::error::ArrowError| {
            Status::internal(format!("schema encoding: {e}"))
        })?;
    Ok(bytes)
}

/// The ticket bytes of a command (what `flight_info` puts in its endpoint).
pub(crate) fn ticket_key(cmd: &Any) -> Vec<u8> {
    cmd.encode_to_vec()
}

pub(crate) fn flight_info(
    schema: &Schema,
    cmd: Any,
    descriptor: FlightDescriptor,
) -> Result<FlightInfo, Status> {
    // The ticket carries the command (for queries with a query id, see `cancel`), so
    // DoGet dispatches on it; no location: clients reuse their connection.
    let endpoint = FlightEndpoint::new().with_ticket(Ticket::new(ticket_key(&cmd)));
    FlightInfo::new()
        .try_with_schema(schema)
        .map_err(|e| Status::internal(format!("schema encoding: {e}")))
        .map(|i| i.with_endpoint(endpoint).with_descriptor(descriptor))
}

pub(crate) fn batch_stream(
    schema: SchemaRef,
    batch: Result<RecordBatch, arrow_flight::error::FlightError>,
) -> DoGetStream {
    let stream = FlightDataEncoderBuilder::new()
        .with_schema(schema)
        .build(futures::stream::once(async move { batch }))
        .map_err(Status::from);
    Box::pin(stream)
}

/// Bytes of Arrow memory `batch` holds: the bytes of its values. Not
/// `RecordBatch::get_array_memory_size`: a batch decoded from Flight keeps all its
/// buffers in one shared message body, whose whole size that counts once per buffer.
pub(crate) fn batch_bytes(batch: &RecordBatch) -> usize {
    batch
        .columns()
        .iter()
        .map(|c| {
            c.to_data()
                .get_slice_memory_size()
                .unwrap_or_else(|_| c.get_array_memory_size())
        })
        .sum()
}

/// A byte size for messages: whole MiB, else bytes.
pub(crate) fn size_text(bytes: usize) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{bytes} bytes")
    }
}

/// The record batches (and schema) of a `DoPut` stream, read until they hold more than
/// `cap` bytes ([`batch_bytes`]): then the call is refused with `RESOURCE_EXHAUSTED`
/// and reading stops, so a client cannot make the server buffer more than `cap`.
/// `what` names the data in messages ("ingest data"); `limit` names the setting or
/// constant that sets `cap`.
pub(crate) async fn read_capped(
    stream: arrow_flight::sql::server::PeekableFlightDataStream,
    cap: usize,
    what: &str,
    limit: &str,
) -> Result<(Vec<RecordBatch>, Option<SchemaRef>), Status> {
    let mut decoded = arrow_flight::decode::FlightRecordBatchStream::new_from_flight_data(
        stream.map_err(Into::into),
    );
    let mut batches = Vec::new();
    let mut held = 0usize;
    while let Some(b) = decoded.next().await {
        let b = b.map_err(|e| Status::invalid_argument(format!("{what}: {e}")))?;
        held = held.saturating_add(batch_bytes(&b));
        if held > cap {
            return Err(Status::resource_exhausted(format!(
                "{what} over {} ({limit}): send less per call",
                size_text(cap)
            )));
        }
        batches.push(b);
    }
    let schema = decoded.schema().map(Arc::clone);
    Ok((batches, schema))
}
