//! The secret of the `hmac_sha256` mask (`[masks] hmac_key_file` of the policy): zeroed
//! on drop, redacted in `Debug`, and known to other processes only by its check value.

use zeroize::Zeroizing;

use crate::error::{Error, Result};

/// The `hmac_sha256` mask's key. Its [`MaskKey::check`] value, not the key, is what a
/// coordinator sends a worker so the worker masks with the same secret or refuses.
#[derive(Clone)]
pub struct MaskKey {
    key: Zeroizing<Vec<u8>>,
    check: String,
}

impl MaskKey {
    /// The shortest secret accepted, in bytes (HMAC-SHA256's output length).
    pub const MIN_LEN: usize = 32;

    /// The key a file holds: its bytes without leading and trailing ASCII whitespace (so
    /// `openssl rand -hex 32 > FILE` gives a 64-byte key); `path` names the file in errors.
    pub fn from_file_bytes(path: &str, bytes: Vec<u8>) -> Result<Self> {
        let bytes = Zeroizing::new(bytes);
        let start = bytes
            .iter()
            .position(|b| !b.is_ascii_whitespace())
            .unwrap_or(bytes.len());
        let end = bytes
            .iter()
            .rposition(|b| !b.is_ascii_whitespace())
            .map_or(start, |e| e + 1);
        let key = Zeroizing::new(bytes[start..end].to_vec());
        if key.len() < Self::MIN_LEN {
            return Err(Error::MaskKey {
                path: path.to_owned(),
                reason: format!(
                    "holds {} bytes; the hmac_sha256 secret needs at least {} (e.g. `openssl rand -hex 32`)",
                    key.len(),
                    Self::MIN_LEN
                ),
            });
        }
        let tag = ring::hmac::sign(
            &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key),
            b"clearice mask key check v1",
        );
        let check = tag.as_ref()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Ok(Self { key, check })
    }

    /// The key bytes. Callers must not log or format them.
    pub fn expose(&self) -> &[u8] {
        &self.key
    }

    /// A check value of the key (16 hex digits of an HMAC of a constant under it): equal
    /// for equal keys, and no help in guessing the key or a masked value.
    pub fn check(&self) -> &str {
        &self.check
    }
}

impl std::fmt::Debug for MaskKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MaskKey(<redacted>, check {})", self.check)
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests may block")]
mod tests {
    use super::*;

    #[test]
    fn mask_key_trims_whitespace_refuses_short_keys_and_never_shows_its_bytes() {
        let secret = "0123456789abcdef0123456789abcdef-secret";
        let k = MaskKey::from_file_bytes("k", format!("  {secret}\n").into_bytes()).unwrap();
        assert_eq!(k.expose(), secret.as_bytes());
        let same = MaskKey::from_file_bytes("k", secret.as_bytes().to_vec()).unwrap();
        assert_eq!(k.check(), same.check());
        assert_eq!(k.check().len(), 16);
        let other = MaskKey::from_file_bytes("k", format!("{secret}!").into_bytes()).unwrap();
        assert_ne!(k.check(), other.check());
        let dbg = format!("{k:?}");
        assert!(!dbg.contains("0123456789abcdef"), "{dbg}");
        let e = MaskKey::from_file_bytes("/etc/hmac.key", b"short\n".to_vec())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("'/etc/hmac.key'") && e.contains("holds 5 bytes") && !e.contains("short"),
            "{e}"
        );
    }
}
