//! Statements: the result schema of a query, running one as a result stream (on the CPU
//! runtime, registered for cancellation), updates run to completion, and the statement
//! calls (`GetFlightInfo`, `DoGet`, `DoPut` update).

use std::sync::Arc;

use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::sql::server::PeekableFlightDataStream;
use arrow_flight::sql::{
    CommandStatementQuery, CommandStatementUpdate, ProstMessageExt, TicketStatementQuery,
};
use arrow_flight::{FlightDescriptor, FlightInfo, Ticket};
use clearice_engine::Session;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::ParamValues;
use datafusion::error::DataFusionError;
use futures::{StreamExt, TryStreamExt};
use tonic::{Request, Response, Status};

use crate::cancel::{Owner, QueryId};
use crate::error::status_of;
use crate::placeholders::number_question_marks;
use crate::wire::{DoGetStream, flight_info, wire_batch, wire_schema};

use super::ClearIceFlightSql;
use super::caller::bearer;
use super::tickets::statement_of_handle;

impl ClearIceFlightSql {
    pub(super) async fn result_schema(
        &self,
        session: Session,
        sql: &str,
    ) -> Result<SchemaRef, Status> {
        let sql = sql.to_owned();
        self.on_cpu(async move {
            let df = session.sql_plan(&sql).await?;
            Ok::<_, DataFusionError>(wire_schema(&session.result_schema(&df)))
        })
        .await?
        .map_err(|e| status_of(&e))
    }

    /// Runs a statement to completion for `DoPut` updates: the rows it reports (a
    /// write's `count`), or the rows it returned; 0 for DDL. Each parameter row of
    /// `params` runs once (a JDBC batch), counts summed.
    pub(super) async fn update(
        &self,
        session: Session,
        token: Option<String>,
        sql: String,
        params: Vec<ParamValues>,
    ) -> Result<i64, Status> {
        let runs = if params.is_empty() {
            vec![None]
        } else {
            params.into_iter().map(Some).collect()
        };
        let session = Arc::new(session);
        let s2 = Arc::clone(&session);
        let counted = self
            .on_cpu(async move {
                let mut total = 0i64;
                for p in runs {
                    let stream = s2.sql_stream_with_params(&sql, p).await?;
                    let schema = stream.schema();
                    let batches: Vec<RecordBatch> = stream.try_collect().await?;
                    total += reported_rows(&schema, &batches);
                }
                Ok::<_, DataFusionError>(total)
            })
            .await?
            .map_err(|e| status_of(&e))?;
        let set = session.take_set_options();
        if let Some(token) = &token
            && !set.is_empty()
        {
            let mut options = self.sessions.get(token);
            options.settings.extend(set);
            self.sessions.set(token, options);
        }
        Ok(counted)
    }

    pub(super) async fn run(
        &self,
        session: Session,
        token: Option<String>,
        sql: &str,
        params: Option<ParamValues>,
        id: QueryId,
    ) -> Result<DoGetStream, Status> {
        let owner = Owner::new(session.principal(), token.as_deref());
        let sql = sql.to_owned();
        // Planned and run on the CPU runtime (when there is one), batches converted for
        // the wire there too; the session lives as long as the stream, and dropping the
        // stream (client gone) cancels the query.
        let start = async move {
            let stream = session.sql_stream_with_params(&sql, params).await?;
            let set = session.take_set_options();
            let schema = wire_schema(&stream.schema());
            let s2 = Arc::clone(&schema);
            let batches = stream.map(move |b| {
                let _keep = &session;
                b.and_then(|b| wire_batch(b, &s2))
            });
            let stream: datafusion::execution::SendableRecordBatchStream = Box::pin(
                datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(schema, batches),
            );
            Ok((stream, set))
        };
        let (stream, set) = match &self.cpu {
            Some(cpu) => cpu.execute_stream(start, Ok).await,
            None => start.await,
        }
        .map_err(|e| status_of(&e))?;
        // `SET` lasts for the Flight session (bearer token), like `catalog`/`schema`.
        if let Some(token) = &token
            && !set.is_empty()
        {
            let mut options = self.sessions.get(token);
            options.settings.extend(set);
            self.sessions.set(token, options);
        }
        let schema = stream.schema();
        let batches = stream.map(|b| b.map_err(|e| status_of(&e).into()));
        // The owner's CancelFlightInfo aborts the stream (which drops, and so cancels, the
        // query); the client then sees CANCELLED.
        let batches = self.running.register(id, owner, batches);
        let flight = FlightDataEncoderBuilder::new()
            .with_schema(schema)
            .build(batches)
            .map_err(Status::from);
        Ok(Box::pin(flight))
    }

    /// `GetFlightInfo` of a statement: its result schema, and a ticket with a fresh query id.
    pub(super) async fn statement_flight_info(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let session = self.session(&request).await?;
        let sql = number_question_marks(&query.query).into_owned();
        let schema = self.result_schema(session, &sql).await?;
        // A fresh random id per FlightInfo: the ticket cannot be made from the SQL text,
        // and the query it starts is cancelled by that id.
        let ticket = TicketStatementQuery {
            statement_handle: QueryId::random().handle(sql.as_bytes()),
        };
        Ok(Response::new(flight_info(
            &schema,
            ticket.as_any(),
            request.into_inner(),
        )?))
    }

    /// `DoGet` of a statement ticket: runs the query.
    pub(super) async fn statement_stream(
        &self,
        ticket: TicketStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let session = self.session(&request).await?;
        let (id, sql) = statement_of_handle(&ticket.statement_handle)?;
        let token = bearer(&request).map(str::to_owned);
        Ok(Response::new(
            self.run(session, token, &sql, None, id).await?,
        ))
    }

    /// `DoPut` of a statement update: runs it to completion.
    pub(super) async fn statement_update(
        &self,
        cmd: CommandStatementUpdate,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        let session = self.session(&request).await?;
        let token = bearer(&request).map(str::to_owned);
        let sql = number_question_marks(&cmd.query).into_owned();
        self.update(session, token, sql, vec![]).await
    }
}

/// The rows a statement reports to an update call: a write's `count` (one UInt64 column
/// of that name), else the rows it returned.
fn reported_rows(schema: &SchemaRef, batches: &[RecordBatch]) -> i64 {
    use datafusion::arrow::array::UInt64Array;
    if schema.fields().len() == 1
        && schema.field(0).name() == "count"
        && schema.field(0).data_type() == &DataType::UInt64
    {
        return batches
            .iter()
            .filter_map(|b| b.column(0).as_any().downcast_ref::<UInt64Array>())
            .flat_map(|a| a.iter().flatten())
            .sum::<u64>() as i64;
    }
    batches.iter().map(|b| b.num_rows() as i64).sum()
}
