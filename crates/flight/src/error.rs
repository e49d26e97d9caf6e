//! DataFusion errors to gRPC status codes (exhaustive over error kinds).

use clearice_engine::{LimitExceeded, Refusal, TableError, cause_of, limit_of, refusal_of};
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
    if let Some(t) = cause_of::<TableError>(e) {
        let code = match t {
            TableError::UnknownPrincipal { .. }
            | TableError::TableDenied { .. }
            | TableError::ColumnDenied { .. } => Code::PermissionDenied,
            TableError::CatalogOpen { .. } | TableError::Iceberg { .. } => Code::Unavailable,
            TableError::DeletesNotSupported { .. } => Code::Unimplemented,
            TableError::Tampered { .. } => Code::DataLoss,
            TableError::UnsupportedLocation { .. } | TableError::Write { .. } => {
                Code::FailedPrecondition
            }
        };
        return Some(Status::new(code, t.to_string()));
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
    // Standalone-file decryption refused by `[files] decrypt` still arrives as text inside
    // a Parquet error (the key retriever's error crosses parquet-rs as a string).
    let policy = msg.contains("may not decrypt");
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(e: impl std::error::Error + Send + Sync + 'static) -> DataFusionError {
        DataFusionError::External(Box::new(e))
    }

    #[test]
    fn typed_errors_map_to_their_codes_with_their_own_message() {
        let cases: Vec<(DataFusionError, Code, &str)> = vec![
            (
                ext(TableError::ColumnDenied {
                    table: "lake.s.t".into(),
                    column: "ssn".into(),
                    principal: "ann".into(),
                    rule: "role:analyst".into(),
                }),
                Code::PermissionDenied,
                "access denied: column 'ssn' of table 'lake.s.t'",
            ),
            (
                ext(TableError::UnknownPrincipal {
                    table: "lake.s.t".into(),
                    principal: "eve".into(),
                    policy: "p.toml".into(),
                }),
                Code::PermissionDenied,
                "principal 'eve' is not a user in policy",
            ),
            (
                ext(TableError::DeletesNotSupported {
                    table: "lake.s.t".into(),
                    snapshot_id: 1,
                    file: "d.parquet".into(),
                }),
                Code::Unimplemented,
                "row-level deletes",
            ),
            (
                ext(Refusal::FileRead {
                    principal: "ann".into(),
                    path: "/etc/x.csv".into(),
                    reason: "it is granted no area".into(),
                }),
                Code::PermissionDenied,
                "principal 'ann' may not read '/etc/x.csv' by path",
            ),
            (
                ext(Refusal::Setting {
                    name: "datafusion.runtime.memory_limit".into(),
                    front: "Flight SQL",
                    reason: "only these options may be set: ...".into(),
                }),
                Code::PermissionDenied,
                "cannot be set over Flight SQL",
            ),
            (
                ext(LimitExceeded::Timeout {
                    limit: std::time::Duration::from_secs(3),
                }),
                Code::DeadlineExceeded,
                "statement timeout",
            ),
            (
                ext(LimitExceeded::Concurrency {
                    principal: "ann".into(),
                    limit: 2,
                }),
                Code::ResourceExhausted,
                "too many statements running for principal 'ann'",
            ),
            (
                DataFusionError::Context(
                    "scan".into(),
                    Box::new(ext(LimitExceeded::Rows { limit: 5 })),
                ),
                Code::ResourceExhausted,
                "more than 5 rows",
            ),
        ];
        for (e, code, text) in cases {
            let s = status_of(&e);
            assert_eq!(s.code(), code, "{e}");
            assert!(
                s.message().starts_with(text) || s.message().contains(text),
                "{}",
                s.message()
            );
            assert!(!s.message().contains("External error"), "{}", s.message());
        }
    }

    #[test]
    fn auth_errors_are_unauthenticated() {
        for e in [
            AuthError::Missing,
            AuthError::Malformed,
            AuthError::BadToken,
            AuthError::Invalid { user: "u".into() },
            AuthError::Throttled {
                user: "u".into(),
                retry_after: std::time::Duration::from_millis(250),
            },
        ] {
            assert_eq!(auth_status(&e).code(), Code::Unauthenticated, "{e}");
        }
    }
}
