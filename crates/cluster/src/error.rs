//! How a distributed query fails because of the cluster.

use std::fmt;

use datafusion::error::DataFusionError;

/// How a distributed query fails because of the cluster (one line each).
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A worker did not take a scan: unsigned or altered bytes, expired, or a table its
    /// catalogs do not have.
    #[error("worker refused the scan: {reason}")]
    Refused {
        /// Why, naming the table.
        reason: String,
    },
    /// Workers stopped answering while the query ran.
    #[error(
        "cluster worker {workers} stopped answering during the query ({reason}); the query was \
         stopped, no partial result was returned: run it again (the next queries run on the \
         other workers)"
    )]
    WorkerLost {
        /// The workers that do not answer now.
        workers: String,
        /// The transport's message.
        reason: String,
    },
    /// A worker call failed although every worker answers.
    #[error(
        "a cluster worker failed during the query ({reason}); the query was stopped, no \
         partial result was returned: run it again"
    )]
    WorkerFailed {
        /// The transport's message.
        reason: String,
    },
    /// A worker's error (a denial, a tampered file, a key it could not get), with the
    /// class it had on the worker.
    #[error("{message}")]
    OnWorker {
        /// Its class on the worker.
        class: clearice_access::ErrorClass,
        /// Its message (one line).
        message: String,
    },
    /// No configured worker answers.
    #[error("no cluster worker answers (configured: {configured})")]
    NoWorkers {
        /// The configured workers.
        configured: String,
    },
}

impl From<ClusterError> for DataFusionError {
    fn from(e: ClusterError) -> Self {
        DataFusionError::External(Box::new(e))
    }
}

/// What a worker can refuse a plan for; one line each, naming the table.
pub(crate) fn refused(what: impl fmt::Display) -> DataFusionError {
    ClusterError::Refused {
        reason: what.to_string(),
    }
    .into()
}
