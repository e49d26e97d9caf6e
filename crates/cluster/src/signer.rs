//! The cluster secret's two uses: scans signed for workers, and each worker call's credential.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tonic::codegen::http;

/// Signs and verifies scans sent to workers (HMAC-SHA256 with the cluster secret), and
/// seals what only cluster members may read in them (a principal's provider token:
/// AES-256-GCM under a key derived from the secret with HKDF-SHA256).
pub struct TaskSigner {
    key: ring::hmac::Key,
    seal: ring::aead::LessSafeKey,
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
        // Its own key, not the signing key: a tag never doubles as a cipher key.
        let prk = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, SEAL_SALT).extract(secret);
        let seal = prk
            .expand(&[SEAL_INFO], &ring::aead::AES_256_GCM)
            .map_err(|_| "the cluster secret's sealing key cannot be derived".to_owned())?;
        Ok(Self {
            key: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret),
            seal: ring::aead::LessSafeKey::new(ring::aead::UnboundKey::from(seal)),
            ttl,
        })
    }

    /// `secret` encrypted for cluster members, bound to `context` (which must be given
    /// again to open it): a fresh 96-bit nonce, then the ciphertext and its tag.
    pub(crate) fn seal(&self, secret: &[u8], context: &[u8]) -> Result<Vec<u8>, &'static str> {
        let mut nonce = [0u8; ring::aead::NONCE_LEN];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut nonce)
            .map_err(|_| "no randomness for a nonce")?;
        let mut out = zeroize::Zeroizing::new(secret.to_vec());
        self.seal
            .seal_in_place_append_tag(
                ring::aead::Nonce::assume_unique_for_key(nonce),
                ring::aead::Aad::from(context),
                &mut *out,
            )
            .map_err(|_| "sealing failed")?;
        let mut sealed = nonce.to_vec();
        sealed.extend_from_slice(&out);
        Ok(sealed)
    }

    /// What [`TaskSigner::seal`] sealed with `context`, if this cluster sealed it so.
    pub(crate) fn open(
        &self,
        sealed: &[u8],
        context: &[u8],
    ) -> Option<zeroize::Zeroizing<Vec<u8>>> {
        if sealed.len() < ring::aead::NONCE_LEN {
            return None;
        }
        let (nonce, body) = sealed.split_at(ring::aead::NONCE_LEN);
        let nonce = ring::aead::Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut body = zeroize::Zeroizing::new(body.to_vec());
        let n = self
            .seal
            .open_in_place(nonce, ring::aead::Aad::from(context), &mut body)
            .ok()?
            .len();
        body.truncate(n);
        Some(body)
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

/// HKDF salt and info of the sealing key (versioned: a new scheme, a new key).
const SEAL_SALT: &[u8] = b"clearice-cluster";
const SEAL_INFO: &[u8] = b"clearice-cluster-seal-v1";

/// What a call credential signs. Scan tags sign JSON (`{...}`), so the two never collide.
fn call_message(path: &str, at: u64) -> String {
    format!("clearice-cluster-v1|{path}|{at}")
}

pub(crate) fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
