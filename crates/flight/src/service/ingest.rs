//! Bulk ingest (`CommandStatementIngest`): a `DoPut` of record batches into a catalog
//! table, authorized before its data is read and read under the ingest byte cap.

use arrow_flight::sql::CommandStatementIngest;
use arrow_flight::sql::server::PeekableFlightDataStream;
use tonic::{Request, Status};

use crate::error::status_of;
use crate::wire::read_capped;

use super::ClearIceFlightSql;

impl ClearIceFlightSql {
    /// `DoPut` of a bulk ingest: authorized first, then read under the byte cap.
    pub(super) async fn statement_ingest(
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
            // A catalog without a schema: the session's default schema in that catalog.
            (Some(c), None) => datafusion::common::TableReference::full(
                c.clone(),
                session.namespace().1,
                cmd.table.clone(),
            ),
            (None, None) => datafusion::common::TableReference::bare(cmd.table.clone()),
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
}
