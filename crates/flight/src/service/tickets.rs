//! Tickets and handles this server issued: the query id and SQL of a statement handle,
//! the query id of a query ticket (for `CancelFlightInfo`), the refusal of a forged one.

use arrow_flight::sql::{CommandPreparedStatementQuery, TicketStatementQuery};
use prost::Message;
use tonic::Status;

use crate::cancel::QueryId;

/// The query id and SQL of a `TicketStatementQuery` handle this server issued.
pub(super) fn statement_of_handle(handle: &[u8]) -> Result<(QueryId, String), Status> {
    let (id, sql) = QueryId::split(handle).ok_or_else(forged_ticket)?;
    let sql = String::from_utf8(sql.to_vec())
        .map_err(|_| Status::invalid_argument("statement handle is not UTF-8 SQL"))?;
    Ok((id, sql))
}

/// The refusal of a query ticket this server did not issue (no query id).
pub(super) fn forged_ticket() -> Status {
    Status::invalid_argument(
        "ticket was not issued by this server (it has no query id): use the ticket of a FlightInfo from GetFlightInfo",
    )
}

/// The query id in the ticket of a query FlightInfo (a statement or a prepared
/// statement); `None` for any other ticket.
pub(super) fn query_id_of_ticket(ticket: &[u8]) -> Option<QueryId> {
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
