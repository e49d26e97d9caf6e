//! The cluster secret's two uses: scans signed for workers, and each worker call's credential.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tonic::codegen::http;

/// Signs and verifies scans sent to workers (HMAC-SHA256 with the cluster secret).
pub struct TaskSigner {
    key: ring::hmac::Key,
    pub(crate) ttl: Duration,
}

impl fmt::Debug for TaskSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskSigner")
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// Shortest cluster secret accepted.
pub const MIN_SECRET_BYTES: usize = 32;

impl TaskSigner {
    /// A signer over `secret` (at least [`MIN_SECRET_BYTES`]); scans expire after `ttl`.
    pub fn new(secret: &[u8], ttl: Duration) -> Result<Self, String> {
        if secret.len() < MIN_SECRET_BYTES {
            return Err(format!(
                "the cluster secret has {} bytes; at least {MIN_SECRET_BYTES} are needed",
                secret.len()
            ));
        }
        Ok(Self {
            key: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret),
            ttl,
        })
    }

    pub(crate) fn sign(&self, body: &[u8]) -> Vec<u8> {
        ring::hmac::sign(&self.key, body).as_ref().to_vec()
    }

    pub(crate) fn verify(&self, body: &[u8], tag: &[u8]) -> bool {
        ring::hmac::verify(&self.key, body, tag).is_ok()
    }

    /// The `authorization` value of one call to the worker RPC `path` (e.g.
    /// `/worker.WorkerService/ExecuteTask`) made now: `ClearIce-Cluster <unix s>.<hex
    /// HMAC-SHA256 of "clearice-cluster-v1|<path>|<unix s>">`. A worker takes it for that
    /// RPC only, within 5 minutes of its stamp either way.
    pub fn call_credential(&self, path: &str) -> String {
        self.credential_at(path, now_s())
    }

    pub(crate) fn credential_at(&self, path: &str, at: u64) -> String {
        let tag = self.sign(call_message(path, at).as_bytes());
        format!("{CALL_SCHEME}{at}.{}", hex::encode(tag))
    }

    /// Whether `headers` carry a credential of this cluster for a call to `path`, made
    /// within [`CALL_WINDOW`] of now; why not, in one line.
    pub(crate) fn check_call(
        &self,
        path: &str,
        headers: &http::HeaderMap,
    ) -> Result<(), &'static str> {
        const MALFORMED: &str =
            "malformed cluster credential (authorization: ClearIce-Cluster <unix s>.<hex tag>)";
        let value = headers
            .get(http::header::AUTHORIZATION)
            .ok_or("no cluster credential: worker calls need the cluster secret")?;
        let (at, tag) = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix(CALL_SCHEME))
            .and_then(|v| v.split_once('.'))
            .ok_or(MALFORMED)?;
        let at: u64 = at.parse().map_err(|_| MALFORMED)?;
        let tag = hex::decode(tag).map_err(|_| MALFORMED)?;
        if !self.verify(call_message(path, at).as_bytes(), &tag) {
            return Err(
                "the cluster credential does not verify with this worker's cluster \
                        secret (another cluster's, or made for another call)",
            );
        }
        if now_s().abs_diff(at) > CALL_WINDOW.as_secs() {
            return Err(
                "the cluster credential is stale (stamped more than 5 minutes from \
                        this worker's clock: a replay, or clocks apart)",
            );
        }
        Ok(())
    }
}

/// How far a call credential's stamp may be from the worker's clock, either way (a
/// replay window and the clock skew tolerated): 5 min.
pub(crate) const CALL_WINDOW: Duration = Duration::from_secs(300);

const CALL_SCHEME: &str = "ClearIce-Cluster ";

/// What a call credential signs. Scan tags sign JSON (`{...}`), so the two never collide.
fn call_message(path: &str, at: u64) -> String {
    format!("clearice-cluster-v1|{path}|{at}")
}

pub(crate) fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
