//! DataFusion errors to gRPC status codes (exhaustive over error kinds).

use clearice_engine::{LimitExceeded, Refusal, limit_of, refusal_of};
use datafusion::error::DataFusionError;

use crate::auth::AuthError;
use tonic::{Code, Status};

fn one_line(e: &impl std::fmt::Display) -> String {
    e.to_string()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The status of refused credentials (every kind is UNAUTHENTICATED; the message says
/// which, without telling whether a user name exists).
pub fn auth_status(e: &AuthError) -> Status {
    let code = match e {
        AuthError::Missing
        | AuthError::Malformed
        | AuthError::EmptyPassword { .. }
        | AuthError::Invalid { .. }
        | AuthError::Throttled { .. }
        | AuthError::BadToken => Code::Unauthenticated,
    };
    Status::new(code, e.to_string())
}

/// The status of a typed ClearIce error inside an engine error, if there is one: its
/// code, and its own message (without DataFusion's "External error:" wrapping).
fn typed_status(e: &DataFusionError) -> Option<Status> {
    if let Some(r) = refusal_of(e) {
        let code = match r {
            Refusal::FileRead { .. }
            | Refusal::FileWrite { .. }
            | Refusal::Setting { .. }
            | Refusal::Statement { .. } => Code::PermissionDenied,
        };
        return Some(Status::new(code, r.to_string()));
    }
    limit_of(e).map(|l| {
        let code = match l {
            LimitExceeded::Timeout { .. } => Code::DeadlineExceeded,
            LimitExceeded::Concurrency { .. }
            | LimitExceeded::Rows { .. }
            | LimitExceeded::Bytes { .. } => Code::ResourceExhausted,
        };
        Status::new(code, l.to_string())
    })
}

/// The status a client sees for an engine error: the engine's one-line message and the
/// code that says what to do about it.
pub fn status_of(e: &DataFusionError) -> Status {
    let msg = one_line(e);
    if let Some(status) = typed_status(e) {
        return status;
    }
    let policy = msg.contains("access denied")
        || msg.contains("is not a user in policy")
        || msg.contains("may not decrypt");
    let code = match e {
        _ if policy => Code::PermissionDenied,
        DataFusionError::Plan(m) if m.contains("not found") => Code::NotFound,
        DataFusionError::SQL(..)
        | DataFusionError::Plan(_)
        | DataFusionError::SchemaError(..)
        | DataFusionError::Configuration(_) => Code::InvalidArgument,
        DataFusionError::NotImplemented(_) => Code::Unimplemented,
        DataFusionError::ResourcesExhausted(_) => Code::ResourceExhausted,
        DataFusionError::ExecutionJoin(_) => Code::Cancelled,
        DataFusionError::Diagnostic(_, inner) | DataFusionError::Context(_, inner) => {
            return status_of(inner);
        }
        // Files, keys, object stores: the data or its keys are not usable right now.
        DataFusionError::ParquetError(_)
        | DataFusionError::ObjectStore(_)
        | DataFusionError::IoError(_)
        | DataFusionError::External(_)
        | DataFusionError::ArrowError(..)
        | DataFusionError::Execution(_) => Code::FailedPrecondition,
        DataFusionError::Substrait(_)
        | DataFusionError::Internal(_)
        | DataFusionError::Shared(_) => Code::Internal,
        DataFusionError::Collection(errs) => {
            return errs
                .first()
                .map(status_of)
                .unwrap_or_else(|| Status::internal(msg));
        }
        DataFusionError::Ffi(_) => Code::Internal,
    };
    if code == Code::Internal {
        tracing::error!(error = %msg, "internal error");
    }
    Status::new(code, msg)
}
