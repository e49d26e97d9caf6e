//! The Flight SQL service: its state, construction and serving. The calls are split by
//! job: `flight_sql` (the `FlightSqlService` impl, which hands each call on), `caller`
//! (authentication, Handshake, the engine session of a call), `query` (statements:
//! planning, running, updates), `ingest` (bulk ingest), `prepare` (prepared
//! statements), `catalog` (metadata listings), `actions` (session options,
//! `CancelFlightInfo`), `tickets` (query ids in tickets and handles).

use std::sync::Arc;

use arrow_flight::flight_service_server::FlightServiceServer;
use arrow_flight::sql::metadata::{SqlInfoData, XdbcTypeInfoData};
use clearice_engine::{CpuExecutor, Engine, ServerConfig};
use tonic::Status;

use crate::auth::Auth;
use crate::cancel::Running;
use crate::error::status_of;
use crate::metadata::{sql_info_data, xdbc_data};
use crate::prepared::PreparedStatements;
use crate::session::Sessions;

mod actions;
mod caller;
mod catalog;
mod flight_sql;
mod ingest;
mod prepare;
mod query;
mod tickets;

/// Most bytes (Arrow memory, see `wire::batch_bytes`) one `DoPut` ingest, or one batch of
/// update parameters, may buffer when `[server.limits] query_memory_mb = 0` sets no
/// per-query limit: 256 MiB. Otherwise the cap is that per-query limit (default
/// 1 GiB): the data is held in memory until the engine writes it.
pub(crate) const INGEST_BYTES_WITHOUT_QUERY_LIMIT: usize = 256 << 20;

/// ClearIce's Flight SQL service: one [`Session`](clearice_engine::Session) per call, as
/// the authenticated user.
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
