//! Arrow Flight SQL endpoint for ClearIce (`clearice serve`): the same lakes and column
//! policy as the shell, for DBeaver (Arrow Flight SQL JDBC driver), ADBC and Superset.
//!
//! ```text
//!  client ──Handshake(Basic)──▶ Auth ──bearer token──▶ every later call
//!         ──GetFlightInfo(cmd)─▶ plan under the principal's policy ─▶ FlightInfo(ticket = cmd + query id)
//!         ──DoGet(ticket)──────▶ Session::sql_stream ─▶ batches (views cast to Utf8/Binary)
//! ```
//!
//! Modules by concern: `service` (the `FlightSqlService` implementation: authentication,
//! the query path on the CPU runtime, session options, actions), `wire` (result encoding:
//! view types cast, FlightInfo with the command as ticket), `metadata` (SqlInfo, XDBC type
//! info, the tables a session may see), `prepared` (prepared statements per owner),
//! `cancel` (random query ids in tickets; running results by id and owner, for
//! `CancelFlightInfo`), `session` (Flight session options per bearer token), `auth`,
//! `error` (error class to gRPC code), `placeholders` (JDBC `?` to `$n`).
//!
//! Memory a client can make the server hold is bounded before it is authorized: an
//! ingest is checked against the policy's write rules before its data is read and is
//! read under the per-query memory limit; bound parameters and open prepared
//! statements are capped (`prepared`).
//!
//! The authenticated user is the policy principal and, with the client address, is in
//! every audit record. Results stream batch by batch; a client that disconnects drops
//! the stream, which cancels the query.
#![forbid(unsafe_code)]
// Dependencies nothing uses fail the build (tests add dev-dependencies, so not there).
#![cfg_attr(not(test), deny(unused_crate_dependencies))]
#![deny(missing_docs)]

mod auth;
mod cancel;
mod error;
mod metadata;
mod placeholders;
mod prepared;
mod service;
pub mod session;
mod wire;

pub use auth::{Auth, AuthError};
pub use error::{auth_status, code_of, status_of};
pub use service::{ClearIceFlightSql, serve};
