//! DataFusion errors to gRPC status codes (exhaustive over error kinds).

use clearice_engine::{ErrorClass, classify, message_of};
use datafusion::error::DataFusionError;

use crate::auth::AuthError;
use tonic::{Code, Status};

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

/// The gRPC code of an error class (exhaustive: a new class must pick its code).
pub fn code_of(class: ErrorClass) -> Code {
    match class {
        ErrorClass::InvalidQuery => Code::InvalidArgument,
        ErrorClass::NotFound => Code::NotFound,
        ErrorClass::Denied => Code::PermissionDenied,
        ErrorClass::Unsupported => Code::Unimplemented,
        ErrorClass::DataUnusable => Code::FailedPrecondition,
        ErrorClass::Tampered => Code::DataLoss,
        ErrorClass::Timeout => Code::DeadlineExceeded,
        ErrorClass::ResourceLimit => Code::ResourceExhausted,
        ErrorClass::Unavailable => Code::Unavailable,
        ErrorClass::Cancelled => Code::Cancelled,
        ErrorClass::Internal => Code::Internal,
    }
}

/// The status a client sees for an engine error: the engine's one-line message and the
/// code that says what to do about it, decided by the error's type.
pub fn status_of(e: &DataFusionError) -> Status {
    let msg = message_of(e);
    let code = code_of(classify(e));
    if code == Code::Internal {
        tracing::error!(error = %msg, "internal error");
    }
    Status::new(code, msg)
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests may block")]
mod tests {
    use clearice_engine::{LimitExceeded, Refusal, TableError};

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
                ext(TableError::SnapshotNotFound {
                    table: "lake.s.t".into(),
                    reason: "no snapshot 1".into(),
                }),
                Code::NotFound,
                "no snapshot 1",
            ),
            (
                ext(TableError::Unsupported {
                    table: "lake.s.t".into(),
                    what: "ORC data files".into(),
                }),
                Code::Unimplemented,
                "ORC data files is not supported yet",
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
