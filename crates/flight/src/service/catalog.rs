//! Metadata calls (`GetCatalogs`, `GetDbSchemas`, `GetTables`, `GetTableTypes`,
//! `GetSqlInfo`, `GetXdbcTypeInfo`, the key tables): the FlightInfo of a metadata
//! command and the listings it returns.

use std::sync::Arc;

use arrow_flight::sql::metadata::GetCatalogsBuilder;
use arrow_flight::sql::{
    CommandGetCatalogs, CommandGetDbSchemas, CommandGetSqlInfo, CommandGetTableTypes,
    CommandGetTables, CommandGetXdbcTypeInfo,
};
use arrow_flight::{FlightDescriptor, FlightInfo, Ticket};
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{Schema, SchemaRef};
use tonic::{Request, Response, Status};

use crate::wire::{DoGetStream, batch_stream, flight_info};

use super::ClearIceFlightSql;

impl ClearIceFlightSql {
    /// The FlightInfo of a command after checking the caller: the command is the ticket.
    pub(super) async fn info(
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
    pub(super) async fn empty_result(
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

    /// `DoGet` of `GetCatalogs`: the catalogs the session sees, sorted.
    pub(super) async fn catalogs_stream(
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

    /// `DoGet` of `GetDbSchemas`: the schemas of every catalog.
    pub(super) async fn db_schemas_stream(
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

    /// `DoGet` of `GetTables`: the tables the session may see.
    pub(super) async fn tables_stream(
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

    /// `DoGet` of `GetTableTypes`: TABLE and VIEW.
    pub(super) async fn table_types_stream(
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

    /// `DoGet` of `GetSqlInfo`.
    pub(super) async fn sql_info_stream(
        &self,
        query: CommandGetSqlInfo,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        self.session(&request).await?;
        let b = query.into_builder(&self.sql_info);
        let schema = b.schema();
        Ok(Response::new(batch_stream(schema, b.build())))
    }

    /// `DoGet` of `GetXdbcTypeInfo`.
    pub(super) async fn xdbc_type_info_stream(
        &self,
        query: CommandGetXdbcTypeInfo,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        self.session(&request).await?;
        let b = query.into_builder(&self.xdbc);
        let schema = b.schema();
        Ok(Response::new(batch_stream(schema, b.build())))
    }
}
