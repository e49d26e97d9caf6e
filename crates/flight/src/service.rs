//! The Flight SQL service.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;

use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::flight_service_server::FlightServiceServer;
use arrow_flight::sql::metadata::{GetCatalogsBuilder, SqlInfoData, XdbcTypeInfoData};
use arrow_flight::sql::server::{FlightSqlService, PeekableFlightDataStream};
use arrow_flight::sql::{
    ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest,
    ActionCreatePreparedStatementResult, CommandGetCatalogs, CommandGetCrossReference,
    CommandGetDbSchemas, CommandGetExportedKeys, CommandGetImportedKeys, CommandGetPrimaryKeys,
    CommandGetSqlInfo, CommandGetTableTypes, CommandGetTables, CommandGetXdbcTypeInfo,
    CommandPreparedStatementQuery, CommandPreparedStatementUpdate, CommandStatementIngest,
    CommandStatementQuery, CommandStatementUpdate, DoPutPreparedStatementResult, ProstMessageExt,
    SqlInfo, TicketStatementQuery,
};
use arrow_flight::{
    Action, FlightDescriptor, FlightInfo, HandshakeRequest, HandshakeResponse, Ticket,
};
use clearice_engine::{CpuExecutor, Engine, ServerConfig, Session};
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::{ParamValues, ScalarValue};
use datafusion::error::DataFusionError;
use futures::{Stream, StreamExt, TryStreamExt};
use prost::Message;
use tonic::metadata::MetadataValue;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::{Auth, AuthError};
use crate::cancel::{Owner, QueryId, Running};
use crate::error::{auth_status, status_of};
use crate::metadata::{keys_schema, sql_info_data, xdbc_data};
use crate::placeholders::number_question_marks;
use crate::prepared::{MAX_PARAMETER_BYTES, PreparedStatements};
use crate::session::{
    CATALOG, CloseSessionResult, CloseSessionStatus, OptionValue, SCHEMA, SessionOptions, Sessions,
    SetSessionOptionsError, SetSessionOptionsErrorValue, SetSessionOptionsRequest,
    SetSessionOptionsResult, options_result,
};
use crate::wire::{
    DoGetStream, batch_stream, flight_info, read_capped, schema_bytes, wire_batch, wire_schema,
    wire_type,
};

/// Most bytes (Arrow memory, see `wire::batch_bytes`) one `DoPut` ingest, or one batch of
/// update parameters, may buffer when `[server.limits] query_memory_mb = 0` sets no
/// per-query limit: 256 MiB. Otherwise the cap is that per-query limit (default
/// 1 GiB): the data is held in memory until the engine writes it.
pub(crate) const INGEST_BYTES_WITHOUT_QUERY_LIMIT: usize = 256 << 20;

/// ClearIce's Flight SQL service: one [`Session`] per call, as the authenticated user.
pub struct ClearIceFlightSql {
    engine: Arc<Engine>,
    auth: Arc<Auth>,
    prepared: PreparedStatements,
    /// Session options by bearer token.
    sessions: Sessions,
    /// Running results by query id, with their owners, for `CancelFlightInfo`.
    running: Running,
    /// Most bytes an ingest (or a batch of update parameters) may buffer.
    ingest_bytes: usize,
    sql_info: SqlInfoData,
    xdbc: XdbcTypeInfoData,
    /// Where queries are planned and run; `None`: on the server's own runtime.
    cpu: Option<CpuExecutor>,
}

impl std::fmt::Debug for ClearIceFlightSql {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClearIceFlightSql")
            .field("auth", &self.auth)
            .finish_non_exhaustive()
    }
}

/// Headers a client may use to pass its own token for the crypto providers.
const KMS_TOKEN_HEADERS: [&str; 2] = ["key_access_token", "kms_token"];

/// The client of a call, for audit records: its address.
fn client_of<T>(request: &Request<T>) -> String {
    request
        .remote_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|| "flight".into())
}

/// The query id and SQL of a `TicketStatementQuery` handle this server issued.
fn statement_of_handle(handle: &[u8]) -> Result<(QueryId, String), Status> {
    let (id, sql) = QueryId::split(handle).ok_or_else(forged_ticket)?;
    let sql = String::from_utf8(sql.to_vec())
        .map_err(|_| Status::invalid_argument("statement handle is not UTF-8 SQL"))?;
    Ok((id, sql))
}

/// The refusal of a query ticket this server did not issue (no query id).
fn forged_ticket() -> Status {
    Status::invalid_argument(
        "ticket was not issued by this server (it has no query id): use the ticket of a FlightInfo from GetFlightInfo",
    )
}

/// The bearer token of a call, if it carries one.
fn bearer<T>(request: &Request<T>) -> Option<&str> {
    request
        .metadata()
        .get("authorization")?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

impl ClearIceFlightSql {
    /// A service over `engine`, with users from `[server]`.
    pub fn new(engine: Arc<Engine>, config: &ServerConfig) -> Self {
        Self {
            engine,
            auth: Arc::new(Auth::new(config)),
            prepared: PreparedStatements::default(),
            sessions: Sessions::default(),
            running: Running::default(),
            ingest_bytes: config
                .limits
                .query_memory()
                .unwrap_or(INGEST_BYTES_WITHOUT_QUERY_LIMIT),
            sql_info: sql_info_data(),
            xdbc: xdbc_data(),
            cpu: None,
        }
    }

    /// Plans and runs queries on `cpu`, a runtime apart from the one serving the network
    /// (logins, cancellation and other clients' calls stay responsive while queries
    /// compute).
    pub fn with_cpu_executor(mut self, cpu: CpuExecutor) -> Self {
        self.cpu = Some(cpu);
        self
    }

    /// Runs `fut` (planning) on the CPU runtime when there is one.
    async fn on_cpu<T: Send + 'static>(
        &self,
        fut: impl Future<Output = T> + Send + 'static,
    ) -> Result<T, Status> {
        match &self.cpu {
            Some(cpu) => cpu.run(fut).await.map_err(|e| status_of(&e)),
            None => Ok(fut.await),
        }
    }

    /// The engine session of a call: its authenticated user, with the options of its
    /// Flight session (if it set any).
    async fn session<T>(&self, request: &Request<T>) -> Result<Session, Status> {
        self.session_with(request, true).await
    }

    /// The status of a refused login or call; failed and throttled logins are audited.
    async fn auth_refused(&self, e: &AuthError, client: &str) -> Status {
        if matches!(e, AuthError::Invalid { .. } | AuthError::Throttled { .. }) {
            tracing::info!(user = e.user(), client, error = %e, "login refused");
            if let Err(a) = self
                .engine
                .audit_event("login", e.user(), client, "login", &e.to_string())
                .await
            {
                tracing::error!(error = %a, "audit record not written");
            }
        }
        auth_status(e)
    }

    /// [`Self::session`]; with `strict = false` session options that no longer apply (a
    /// namespace dropped since) are skipped instead of failing the call, so the session
    /// actions can still repair or close the session.
    async fn session_with<T>(&self, request: &Request<T>, strict: bool) -> Result<Session, Status> {
        let header = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        let client = client_of(request);
        let user = match self
            .auth
            .authenticate(header, request.remote_addr().map(|a| a.ip()))
            .await
        {
            Ok(u) => u,
            Err(e) => return Err(self.auth_refused(&e, &client).await),
        };
        // A per-user token for the crypto providers (PyArrow's key_access_token; a JDBC
        // URL parameter arrives as a header): remote providers send it instead of their
        // own credentials, so the service decides for the token's holder. Without a
        // provider that takes tokens it would be silently ignored: refuse it instead.
        let mut credential = None;
        if let Some(name) = KMS_TOKEN_HEADERS
            .iter()
            .find(|h| request.metadata().contains_key(**h))
        {
            if !self.engine.takes_provider_tokens() {
                return Err(Status::invalid_argument(format!(
                    "'{name}' was sent, but no configured crypto provider takes per-user tokens (the KMS is {}; add a remote provider)",
                    self.engine
                        .key_resolver()
                        .kms()
                        .map_or("none", |k| k.name())
                )));
            }
            let token = request
                .metadata()
                .get(*name)
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .ok_or_else(|| {
                    Status::invalid_argument(format!("'{name}' is empty or not ASCII"))
                })?;
            credential = Some(clearice_engine::AccessToken::new(token));
        }
        let session = self
            .engine
            .session_as(clearice_engine::Caller::network(user, client, credential));
        if let Some(token) = bearer(request) {
            let options = self.sessions.get(token);
            if options != SessionOptions::default()
                && let Err(e) =
                    session.use_namespace(options.catalog.as_deref(), options.schema.as_deref())
                && strict
            {
                return Err(status_of(&e));
            }
            for (name, value) in &options.settings {
                if let Err(e) = session.set_option(name, value)
                    && strict
                {
                    return Err(status_of(&e));
                }
            }
        }
        Ok(session)
    }

    /// `SetSessionOptions`: `catalog` and `schema` (strings); an empty value unsets.
    fn set_session_options(
        &self,
        session: &Session,
        token: &str,
        request: SetSessionOptionsRequest,
    ) -> SetSessionOptionsResult {
        let mut options = self.sessions.get(token);
        let mut errors = HashMap::new();
        let mut fail = |name: &str, e: SetSessionOptionsError| {
            errors.insert(
                name.to_owned(),
                SetSessionOptionsErrorValue { value: e as i32 },
            );
        };
        // The catalog first: the schema is looked up in it.
        let mut requested: Vec<_> = request.session_options.into_iter().collect();
        requested.sort_by_key(|(name, _)| name != CATALOG);
        for (name, value) in requested {
            if name != CATALOG && name != SCHEMA {
                fail(&name, SetSessionOptionsError::InvalidName);
                continue;
            }
            let value = match value.option_value {
                None => None,
                Some(OptionValue::StringValue(v)) if v.is_empty() => None,
                Some(OptionValue::StringValue(v)) => Some(v),
                Some(_) => {
                    fail(&name, SetSessionOptionsError::InvalidValue);
                    continue;
                }
            };
            let (catalog, schema) = if name == CATALOG {
                (value.as_deref(), None)
            } else {
                (None, value.as_deref())
            };
            if session.use_namespace(catalog, schema).is_err() {
                fail(&name, SetSessionOptionsError::InvalidValue);
                continue;
            }
            if name == CATALOG {
                options.catalog = value;
            } else {
                options.schema = value;
            }
        }
        self.sessions.set(token, options);
        SetSessionOptionsResult { errors }
    }

    /// The FlightInfo of a command after checking the caller: the command is the ticket.
    async fn info(
        &self,
        request: Request<FlightDescriptor>,
        schema: &Schema,
        cmd: arrow_flight::sql::Any,
    ) -> Result<Response<FlightInfo>, Status> {
        self.session(&request).await?;
        Ok(Response::new(flight_info(
            schema,
            cmd,
            request.into_inner(),
        )?))
    }

    /// An empty result of `schema` after checking the caller (key tables: no keys).
    async fn empty_result(
        &self,
        request: Request<Ticket>,
        schema: SchemaRef,
    ) -> Result<Response<DoGetStream>, Status> {
        self.session(&request).await?;
        Ok(Response::new(batch_stream(
            Arc::clone(&schema),
            Ok(RecordBatch::new_empty(schema)),
        )))
    }

    async fn result_schema(&self, session: Session, sql: &str) -> Result<SchemaRef, Status> {
        let sql = sql.to_owned();
        self.on_cpu(async move {
            let df = session.sql_plan(&sql).await?;
            Ok::<_, DataFusionError>(wire_schema(df.schema().as_arrow()))
        })
        .await?
        .map_err(|e| status_of(&e))
    }

    /// Runs a statement to completion for `DoPut` updates: the rows it reports (a
    /// write's `count`), or the rows it returned; 0 for DDL. Each parameter row of
    /// `params` runs once (a JDBC batch), counts summed.
    async fn update(
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

    async fn run(
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
}

#[tonic::async_trait]
impl FlightSqlService for ClearIceFlightSql {
    type FlightService = ClearIceFlightSql;

    async fn do_handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<
        Response<Pin<Box<dyn Stream<Item = Result<HandshakeResponse, Status>> + Send>>>,
        Status,
    > {
        let header = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| {
                Status::unauthenticated(
                    "Handshake needs 'authorization: Basic ...' credentials or a bearer token",
                )
            })?;
        let client = request
            .remote_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|| "flight".into());
        // A client holding a token (the JDBC driver's `token=` property) handshakes with
        // `Bearer`: the token stays the session's, as long as it is valid.
        let (user, token) = match header.strip_prefix("Bearer ") {
            Some(t) => {
                let t = t.trim();
                let user = match self.auth.authenticate(Some(header), None).await {
                    Ok(u) => u,
                    Err(e) => return Err(self.auth_refused(&e, &client).await),
                };
                (user, t.to_owned())
            }
            None => match self
                .auth
                .login(header, request.remote_addr().map(|a| a.ip()))
                .await
            {
                Ok(found) => found,
                Err(e) => return Err(self.auth_refused(&e, &client).await),
            },
        };
        self.auth.prune();
        self.sessions.retain(|t| self.auth.token_valid(t));
        tracing::info!(user, client = ?request.remote_addr(), "login");
        let reply = HandshakeResponse {
            protocol_version: 0,
            payload: token.clone().into(),
        };
        let mut response: Response<Pin<Box<dyn Stream<Item = _> + Send>>> =
            Response::new(Box::pin(futures::stream::iter(vec![Ok(reply)])));
        let value = MetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|_| Status::internal("token header"))?;
        response.metadata_mut().insert("authorization", value);
        Ok(response)
    }

    async fn get_flight_info_statement(
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

    async fn do_get_statement(
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

    async fn do_put_statement_update(
        &self,
        cmd: CommandStatementUpdate,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        let session = self.session(&request).await?;
        let token = bearer(&request).map(str::to_owned);
        let sql = number_question_marks(&cmd.query).into_owned();
        self.update(session, token, sql, vec![]).await
    }

    async fn do_put_statement_ingest(
        &self,
        cmd: CommandStatementIngest,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        use arrow_flight::sql::{TableExistsOption, TableNotExistOption};
        let session = self.session(&request).await?;
        if cmd.temporary {
            return Err(Status::unimplemented(
                "temporary tables are not supported: ingest into a catalog table",
            ));
        }
        if cmd.transaction_id.is_some() {
            return Err(Status::unimplemented("transactions are not supported"));
        }
        let options = cmd.table_definition_options.unwrap_or_default();
        let create = options.if_not_exist() == TableNotExistOption::Create;
        let append = match options.if_exists() {
            TableExistsOption::Append => true,
            TableExistsOption::Fail | TableExistsOption::Unspecified => false,
            TableExistsOption::Replace => {
                return Err(Status::unimplemented(
                    "ingest mode replace is not supported (it cannot be one commit): use append, or INSERT OVERWRITE",
                ));
            }
        };
        let table = match (&cmd.catalog, &cmd.schema) {
            (Some(c), Some(s)) => {
                datafusion::common::TableReference::full(c.clone(), s.clone(), cmd.table.clone())
            }
            (None, Some(s)) => {
                datafusion::common::TableReference::partial(s.clone(), cmd.table.clone())
            }
            _ => datafusion::common::TableReference::bare(cmd.table.clone()),
        };
        // Authorized before a byte of data is read, then read under a byte cap: a
        // principal that may not write cannot make the server buffer anything.
        session
            .authorize_ingest(&table)
            .await
            .map_err(|e| status_of(&e))?;
        let (batches, schema) = read_capped(
            request.into_inner(),
            self.ingest_bytes,
            "ingest data",
            "the per-query memory limit, [server.limits] query_memory_mb",
        )
        .await?;
        let schema = match (batches.first(), schema) {
            (Some(b), _) => b.schema(),
            (None, Some(s)) => s,
            (None, None) => return Ok(0),
        };
        let rows = self
            .on_cpu(async move {
                session
                    .ingest(&table, schema, batches, create, append)
                    .await
            })
            .await?
            .map_err(|e| status_of(&e))?;
        Ok(rows as i64)
    }

    async fn do_put_prepared_statement_update(
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

    async fn do_action_create_prepared_statement(
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
                Ok::<_, DataFusionError>((wire_schema(df.schema().as_arrow()), params))
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

    async fn do_put_prepared_statement_query(
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

    async fn get_flight_info_prepared_statement(
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

    async fn do_get_prepared_statement(
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

    async fn do_action_close_prepared_statement(
        &self,
        query: ActionClosePreparedStatementRequest,
        request: Request<Action>,
    ) -> Result<(), Status> {
        let session = self.session(&request).await?;
        let handle = String::from_utf8_lossy(&query.prepared_statement_handle).into_owned();
        self.prepared.close(&handle, session.principal());
        Ok(())
    }

    async fn get_flight_info_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.into_builder().schema();
        self.info(request, &schema, query.as_any()).await
    }

    async fn do_get_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let session = self.session(&request).await?;
        let mut b: GetCatalogsBuilder = query.into_builder();
        let mut names = session.catalog_names();
        names.sort();
        for c in names {
            b.append(c);
        }
        let schema = b.schema();
        Ok(Response::new(batch_stream(schema, b.build())))
    }

    async fn get_flight_info_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        self.info(request, &schema, query.as_any()).await
    }

    async fn do_get_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let session = self.session(&request).await?;
        session.refresh_catalogs().await;
        let mut b = query.into_builder();
        for c in session.catalog_names() {
            if let Some(cat) = session.catalog(&c) {
                for s in cat.schema_names() {
                    b.append(&c, s);
                }
            }
        }
        let schema = b.schema();
        Ok(Response::new(batch_stream(schema, b.build())))
    }

    async fn get_flight_info_tables(
        &self,
        query: CommandGetTables,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        self.info(request, &schema, query.as_any()).await
    }

    async fn do_get_tables(
        &self,
        query: CommandGetTables,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let session = self.session(&request).await?;
        let mut b = query.into_builder();
        for (c, s, t, kind, schema) in self.table_list(&session).await {
            b.append(c, s, t, kind, &schema)
                .map_err(|e| Status::internal(e.to_string()))?;
        }
        let schema = b.schema();
        Ok(Response::new(batch_stream(schema, b.build())))
    }

    async fn get_flight_info_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.into_builder().schema();
        self.info(request, &schema, query.as_any()).await
    }

    async fn do_get_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        self.session(&request).await?;
        let mut b = query.into_builder();
        b.append("TABLE");
        b.append("VIEW");
        let schema = b.schema();
        Ok(Response::new(batch_stream(schema, b.build())))
    }

    async fn get_flight_info_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder(&self.sql_info).schema();
        self.info(request, &schema, query.as_any()).await
    }

    async fn do_get_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        self.session(&request).await?;
        let b = query.into_builder(&self.sql_info);
        let schema = b.schema();
        Ok(Response::new(batch_stream(schema, b.build())))
    }

    async fn get_flight_info_xdbc_type_info(
        &self,
        query: CommandGetXdbcTypeInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.into_builder(&self.xdbc).schema();
        self.info(request, &schema, query.as_any()).await
    }

    async fn do_get_xdbc_type_info(
        &self,
        query: CommandGetXdbcTypeInfo,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        self.session(&request).await?;
        let b = query.into_builder(&self.xdbc);
        let schema = b.schema();
        Ok(Response::new(batch_stream(schema, b.build())))
    }

    async fn get_flight_info_primary_keys(
        &self,
        query: CommandGetPrimaryKeys,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.info(request, &keys_schema(false), query.as_any())
            .await
    }

    async fn do_get_primary_keys(
        &self,
        _query: CommandGetPrimaryKeys,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        self.empty_result(request, keys_schema(false)).await
    }

    async fn get_flight_info_exported_keys(
        &self,
        query: CommandGetExportedKeys,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.info(request, &keys_schema(true), query.as_any()).await
    }

    async fn do_get_exported_keys(
        &self,
        _query: CommandGetExportedKeys,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        self.empty_result(request, keys_schema(true)).await
    }

    async fn get_flight_info_imported_keys(
        &self,
        query: CommandGetImportedKeys,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.info(request, &keys_schema(true), query.as_any()).await
    }

    async fn do_get_imported_keys(
        &self,
        _query: CommandGetImportedKeys,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        self.empty_result(request, keys_schema(true)).await
    }

    async fn get_flight_info_cross_reference(
        &self,
        query: CommandGetCrossReference,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.info(request, &keys_schema(true), query.as_any()).await
    }

    async fn do_get_cross_reference(
        &self,
        _query: CommandGetCrossReference,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        self.empty_result(request, keys_schema(true)).await
    }

    async fn do_action_fallback(
        &self,
        request: Request<Action>,
    ) -> Result<
        Response<<Self as arrow_flight::flight_service_server::FlightService>::DoActionStream>,
        Status,
    > {
        let session = self.session_with(&request, false).await?;
        let token = bearer(&request).map(str::to_owned);
        let action = request.into_inner();
        let reply = |body: Vec<u8>| -> Response<
            <Self as arrow_flight::flight_service_server::FlightService>::DoActionStream,
        > {
            Response::new(Box::pin(futures::stream::iter(vec![Ok(
                arrow_flight::Result { body: body.into() },
            )])))
        };
        let session_token = || {
            token.clone().ok_or_else(|| {
                Status::failed_precondition(
                    "session options need a bearer token: log in with Handshake first",
                )
            })
        };
        match action.r#type.as_str() {
            "CancelFlightInfo" => {}
            "SetSessionOptions" => {
                let token = session_token()?;
                let req = SetSessionOptionsRequest::decode(action.body).map_err(|e| {
                    Status::invalid_argument(format!("SetSessionOptionsRequest: {e}"))
                })?;
                let result = self.set_session_options(&session, &token, req);
                return Ok(reply(result.encode_to_vec()));
            }
            "GetSessionOptions" => {
                session_token()?;
                // What is in effect: the defaults until the session sets its own.
                let (catalog, schema) = session.namespace();
                return Ok(reply(options_result(&catalog, &schema).encode_to_vec()));
            }
            "CloseSession" => {
                let token = session_token()?;
                self.sessions.close(&token);
                let result = CloseSessionResult {
                    status: CloseSessionStatus::Closed as i32,
                };
                return Ok(reply(result.encode_to_vec()));
            }
            other => {
                return Err(Status::unimplemented(format!(
                    "action '{other}' is not supported"
                )));
            }
        }
        let req = arrow_flight::CancelFlightInfoRequest::decode(action.body)
            .map_err(|e| Status::invalid_argument(format!("CancelFlightInfoRequest: {e}")))?;
        // Only the caller's own streams (same principal and bearer token) are cancelled;
        // anything else answers as an unknown ticket does.
        let owner = Owner::new(session.principal(), token.as_deref());
        let mut cancelled = false;
        for ep in req.info.map(|i| i.endpoint).unwrap_or_default() {
            if let Some(id) = ep
                .ticket
                .as_ref()
                .and_then(|t| query_id_of_ticket(&t.ticket))
                && self.running.cancel(&id, &owner)
            {
                cancelled = true;
            }
        }
        let status = if cancelled {
            arrow_flight::CancelStatus::Cancelled
        } else {
            arrow_flight::CancelStatus::NotCancellable
        };
        let result = arrow_flight::CancelFlightInfoResult::new(status);
        Ok(reply(result.encode_to_vec()))
    }

    async fn list_custom_actions(&self) -> Option<Vec<Result<arrow_flight::ActionType, Status>>> {
        let action = |name: &str, description: &str| {
            Ok(arrow_flight::ActionType {
                r#type: name.into(),
                description: description.into(),
            })
        };
        Some(vec![
            action(
                "CancelFlightInfo",
                "Cancel a running FlightInfo (CancelFlightInfoRequest)",
            ),
            action(
                "SetSessionOptions",
                "Set session options: catalog, schema (SetSessionOptionsRequest)",
            ),
            action(
                "GetSessionOptions",
                "Current session options (GetSessionOptionsRequest)",
            ),
            action("CloseSession", "Close the session (CloseSessionRequest)"),
        ])
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}

/// Serves Flight SQL on `listener` until `shutdown` resolves; in-flight calls finish.
pub async fn serve(
    service: ClearIceFlightSql,
    listener: tokio::net::TcpListener,
    tls: Option<tonic::transport::ServerTlsConfig>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls)?;
    }
    // Nagle's algorithm off: with it, small responses (GetFlightInfo, the last frames of a
    // result) wait for the client's delayed ACK, ~40 ms per call. tonic sets this only on
    // listeners it binds itself.
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    builder
        .add_service(FlightServiceServer::new(service))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// The query id in the ticket of a query FlightInfo (a statement or a prepared
/// statement); `None` for any other ticket.
fn query_id_of_ticket(ticket: &[u8]) -> Option<QueryId> {
    let any = arrow_flight::sql::Any::decode(ticket).ok()?;
    let handle = if let Ok(Some(t)) = any.unpack::<TicketStatementQuery>() {
        t.statement_handle
    } else if let Ok(Some(c)) = any.unpack::<CommandPreparedStatementQuery>() {
        c.prepared_statement_handle
    } else {
        return None;
    };
    QueryId::split(&handle).map(|(id, _)| id)
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
