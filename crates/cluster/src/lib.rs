//! Scale-out on datafusion-distributed: one coordinator, several workers.
//!
//! ```text
//!  coordinator (clearice [serve] --distributed)      worker (clearice worker)
//!  SQL ─▶ plan: policy decided, audited ─▶           own catalogs, own KMS / providers
//!        RemoteScanExec leaves (key ids, masks)
//!  ClusterRule: DistributedPhysicalOptimizerRule     Worker (gRPC): decodes the stage,
//!    cuts stages; ClearIceCodec signs each scan ───▶   verifies the signature, plans the
//!  NetworkCoalesceExec ◀── Arrow batches (masked) ──   scan again, decrypts, masks
//! ```
//!
//! Policy decisions, masks and audit records are made once, on the coordinator, when the
//! table is resolved. A worker receives a [`ScanRequest`](clearice_access::remote::ScanRequest): table, pinned snapshot, columns,
//! filters, the master key ids the scan may use and the masks; it unwraps keys with its
//! own KMS and masks before a batch leaves it. Plans carry no key bytes and no footer.
//! Each scan is signed with the cluster secret (HMAC-SHA256) and stamped: a worker refuses
//! a scan it cannot verify or that is older than `task_ttl_s`, so a peer that can reach a
//! worker's port cannot make it decrypt for a principal the coordinator did not admit.
//! Each scan names the query it was signed for; the coordinator tells the workers when that
//! query ends ([`END_QUERY`]) and they refuse its scans from then on. A principal's own
//! provider token travels in the scan, sealed for cluster members. A query's memory limit
//! and remaining time travel with its stage plans ([`MEMORY_HEADER`], [`TIMEOUT_HEADER`]);
//! a worker caps them ([`QueryBudgets`]), runs the query's tasks in one pool of that size,
//! stops them at the deadline and drops what they hold when the query ends.
//!
//! Every call to a worker is authenticated before its message is read: the coordinator's
//! and the workers' own channels (`ClusterChannels`) put a credential made with the same
//! secret in the call's `authorization` header, and the worker's server ([`serve`]) answers
//! any other call `UNAUTHENTICATED` from its headers alone. Messages are bounded by
//! [`MAX_MESSAGE_BYTES`] on both sides. With a [`ClusterTls`] every channel is mutual TLS
//! under the cluster's own CA.
// Dependencies nothing uses fail the build (tests add dev-dependencies, so not there).
#![cfg_attr(not(test), deny(unused_crate_dependencies))]
#![forbid(unsafe_code)]

mod budget;
mod channels;
mod classes;
mod codec;
mod coordinator;
mod error;
mod queries;
mod retry;
mod signer;
#[cfg(test)]
mod tests;
mod tls;
mod wire;
mod worker;

pub use budget::{MEMORY_HEADER, QUERY_TIMEOUT_S, QueryBudgets, TIMEOUT_HEADER};
pub use channels::MAX_MESSAGE_BYTES;
pub use classes::Classifier;
pub use codec::ClearIceCodec;
pub use coordinator::{Coordinator, PROBE_EVERY_MS, Workers};
pub use error::ClusterError;
pub use queries::{END_QUERY, QUERY_HEADER, encoding_for};
pub use retry::{MAX_ATTEMPTS, RETRY_WINDOW_MB};
pub use signer::{MIN_SECRET_BYTES, TaskSigner};
pub use tls::ClusterTls;
pub use worker::{WorkerScans, WorkerSessions, serve, worker};
