//! Prepared statement calls: create (planned for its schemas), bind parameters, its
//! FlightInfo and `DoGet`, updates (one run per parameter row), close.

use arrow_flight::sql::server::PeekableFlightDataStream;
use arrow_flight::sql::{
    ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest,
    ActionCreatePreparedStatementResult, CommandPreparedStatementQuery,
    CommandPreparedStatementUpdate, DoPutPreparedStatementResult, ProstMessageExt,
};
use arrow_flight::{Action, FlightDescriptor, FlightInfo, Ticket};
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::{ParamValues, ScalarValue};
use datafusion::error::DataFusionError;
use tonic::{Request, Response, Status};

use crate::cancel::QueryId;
use crate::error::status_of;
use crate::placeholders::number_question_marks;
use crate::prepared::MAX_PARAMETER_BYTES;
use crate::wire::{DoGetStream, flight_info, read_capped, schema_bytes, wire_schema, wire_type};

use super::ClearIceFlightSql;
use super::caller::bearer;
use super::tickets::forged_ticket;

impl ClearIceFlightSql {
    /// `DoPut` of a prepared update: one run per parameter row (sent, else bound).
    pub(super) async fn prepared_statement_update(
        &self,
        cmd: CommandPreparedStatementUpdate,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        let session = self.session(&request).await?;
        let token = bearer(&request).map(str::to_owned);
        let handle = String::from_utf8_lossy(&cmd.prepared_statement_handle).into_owned();
        let (sql, bound) = self.prepared.get(&handle, session.principal())?;
        // Parameters sent with the update (a JDBC batch: one run per row), else the
        // ones bound before.
        let (sent, _) = read_capped(
            request.into_inner(),
            self.ingest_bytes,
            "parameters",
            "the per-query memory limit, [server.limits] query_memory_mb",
        )
        .await?;
        let rows: Vec<RecordBatch> = if sent.iter().any(|b| b.num_rows() > 0) {
            sent
        } else {
            bound.into_iter().collect()
        };
        let mut params = Vec::new();
        for b in &rows {
            for r in 0..b.num_rows() {
                params.push(ParamValues::List(
                    (0..b.num_columns())
                        .map(|i| ScalarValue::try_from_array(b.column(i), r).map(Into::into))
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|e| status_of(&e))?,
                ));
            }
        }
        self.update(session, token, sql, params).await
    }

    /// `CreatePreparedStatement`: plans the query for its result and parameter schemas.
    pub(super) async fn create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        request: Request<Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        let session = self.session(&request).await?;
        let sql = number_question_marks(&query.query).into_owned();
        let user = session.principal().to_owned();
        let planned = {
            let sql = sql.clone();
            self.on_cpu(async move {
                let df = session.sql_plan(&sql).await?;
                let params = df.logical_plan().get_parameter_types()?;
                Ok::<_, DataFusionError>((wire_schema(&session.result_schema(&df)), params))
            })
            .await?
        };
        let (dataset, params) = planned.map_err(|e| status_of(&e))?;
        let mut params: Vec<(String, Option<DataType>)> = params.into_iter().collect();
        params.sort_by_key(|(name, _)| {
            name.trim_start_matches('$')
                .parse::<usize>()
                .unwrap_or(usize::MAX)
        });
        let param_schema = Schema::new(
            params
                .iter()
                .map(|(n, t)| Field::new(n, wire_type(t.as_ref().unwrap_or(&DataType::Utf8)), true))
                .collect::<Vec<_>>(),
        );
        // Clients that crash never close their statements: idle ones go after a token TTL.
        let handle = self.prepared.insert(&user, sql, self.auth.ttl())?;
        Ok(ActionCreatePreparedStatementResult {
            prepared_statement_handle: handle.into_bytes().into(),
            dataset_schema: schema_bytes(&dataset)?,
            parameter_schema: schema_bytes(&param_schema)?,
        })
    }

    /// `DoPut` of a prepared query: binds its parameters (capped).
    pub(super) async fn bind_prepared_statement(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<DoPutPreparedStatementResult, Status> {
        let session = self.session(&request).await?;
        let handle = String::from_utf8_lossy(&query.prepared_statement_handle).into_owned();
        // Bound parameters stay in memory as long as the statement: capped per set.
        let (batches, _) = read_capped(
            request.into_inner(),
            MAX_PARAMETER_BYTES,
            "parameters",
            "the most one bound parameter set may hold",
        )
        .await?;
        self.prepared.bind(&handle, session.principal(), batches)?;
        Ok(DoPutPreparedStatementResult {
            prepared_statement_handle: Some(handle.into_bytes().into()),
        })
    }

    /// `GetFlightInfo` of a prepared statement: a ticket with a fresh query id.
    pub(super) async fn prepared_statement_flight_info(
        &self,
        cmd: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let session = self.session(&request).await?;
        let handle = String::from_utf8_lossy(&cmd.prepared_statement_handle).into_owned();
        let (sql, _) = self.prepared.get(&handle, session.principal())?;
        let schema = self.result_schema(session, &sql).await?;
        // The ticket is the command with a fresh query id before the handle (see
        // `cancel`): each execution is cancelled by its own id.
        let ticket = CommandPreparedStatementQuery {
            prepared_statement_handle: QueryId::random().handle(handle.as_bytes()),
        };
        Ok(Response::new(flight_info(
            &schema,
            ticket.as_any(),
            request.into_inner(),
        )?))
    }

    /// `DoGet` of a prepared statement ticket: runs it with its bound parameters.
    pub(super) async fn prepared_statement_stream(
        &self,
        cmd: CommandPreparedStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let session = self.session(&request).await?;
        let (id, handle) =
            QueryId::split(&cmd.prepared_statement_handle).ok_or_else(forged_ticket)?;
        let handle = String::from_utf8_lossy(handle).into_owned();
        let (sql, params) = self.prepared.get(&handle, session.principal())?;
        let params = match params {
            Some(b) => Some(ParamValues::List(
                (0..b.num_columns())
                    .map(|i| ScalarValue::try_from_array(b.column(i), 0).map(Into::into))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| status_of(&e))?,
            )),
            None => None,
        };
        let token = bearer(&request).map(str::to_owned);
        Ok(Response::new(
            self.run(session, token, &sql, params, id).await?,
        ))
    }

    /// `ClosePreparedStatement`: forgets the caller's statement.
    pub(super) async fn close_prepared_statement(
        &self,
        query: ActionClosePreparedStatementRequest,
        request: Request<Action>,
    ) -> Result<(), Status> {
        let session = self.session(&request).await?;
        let handle = String::from_utf8_lossy(&query.prepared_statement_handle).into_owned();
        self.prepared.close(&handle, session.principal());
        Ok(())
    }
}
