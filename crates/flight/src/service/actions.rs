//! Flight actions beyond Flight SQL's own: `SetSessionOptions`, `GetSessionOptions`,
//! `CloseSession` (options per bearer token) and `CancelFlightInfo` (the caller's own
//! running queries, by the query ids in their tickets).

use std::collections::HashMap;

use arrow_flight::Action;
use clearice_engine::Session;
use prost::Message;
use tonic::{Request, Response, Status};

use crate::cancel::Owner;
use crate::session::{
    CATALOG, CloseSessionResult, CloseSessionStatus, OptionValue, SCHEMA, SetSessionOptionsError,
    SetSessionOptionsErrorValue, SetSessionOptionsRequest, SetSessionOptionsResult, options_result,
};

use super::ClearIceFlightSql;
use super::caller::bearer;
use super::tickets::query_id_of_ticket;

impl ClearIceFlightSql {
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

    /// `DoAction` of the actions Flight SQL does not handle: `CancelFlightInfo` and the
    /// session options actions.
    pub(super) async fn custom_action(
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
}

/// The actions of [`ClearIceFlightSql::custom_action`], for `ListActions`.
pub(super) fn custom_actions() -> Option<Vec<Result<arrow_flight::ActionType, Status>>> {
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
