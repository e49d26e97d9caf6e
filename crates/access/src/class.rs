//! The classes of errors the front ends answer by.

/// What an engine error means for whoever asked, decided by the error's type: how the
/// front ends pick a gRPC code (Flight SQL) or an exit code (CLI), and the class a cluster
/// worker's error keeps on its way to the coordinator. `clearice_engine::classify` decides
/// it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// The SQL does not parse or plan (syntax, unknown column, bad option value).
    InvalidQuery,
    /// A named catalog, schema or table does not exist.
    NotFound,
    /// The policy or the session's confinement refuses it.
    Denied,
    /// Not implemented (yet).
    Unsupported,
    /// The data or its keys cannot be used: a missing key, an unreadable file.
    DataUnusable,
    /// An encrypted module failed authentication: the file was altered.
    Tampered,
    /// The statement ran longer than its timeout.
    Timeout,
    /// A resource limit: memory, result size, concurrent statements.
    ResourceLimit,
    /// A catalog or KMS could not be reached.
    Unavailable,
    /// The statement was cancelled.
    Cancelled,
    /// A bug or an unexpected state.
    Internal,
}

impl ErrorClass {
    /// Every class, in declaration order.
    pub const ALL: [Self; 11] = [
        Self::InvalidQuery,
        Self::NotFound,
        Self::Denied,
        Self::Unsupported,
        Self::DataUnusable,
        Self::Tampered,
        Self::Timeout,
        Self::ResourceLimit,
        Self::Unavailable,
        Self::Cancelled,
        Self::Internal,
    ];

    /// A stable lower-case name (the cluster's wire tag).
    pub fn name(self) -> &'static str {
        match self {
            Self::InvalidQuery => "invalid_query",
            Self::NotFound => "not_found",
            Self::Denied => "denied",
            Self::Unsupported => "unsupported",
            Self::DataUnusable => "data_unusable",
            Self::Tampered => "tampered",
            Self::Timeout => "timeout",
            Self::ResourceLimit => "resource_limit",
            Self::Unavailable => "unavailable",
            Self::Cancelled => "cancelled",
            Self::Internal => "internal",
        }
    }

    /// The class named `name` ([`Self::name`]).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_distinct() {
        let names: std::collections::BTreeSet<_> =
            ErrorClass::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(names.len(), ErrorClass::ALL.len());
        for c in ErrorClass::ALL {
            assert_eq!(ErrorClass::from_name(c.name()), Some(c));
        }
        assert_eq!(ErrorClass::from_name("Denied"), None);
    }
}
