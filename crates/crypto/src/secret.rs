//! Secret key bytes: zeroized on drop, redacted in `Debug`, no `Display`.

use zeroize::{Zeroize, ZeroizeOnDrop};

/// Key bytes (a master key, KEK or DEK). Never printed; zeroed when dropped.
#[derive(Clone, Zeroize, ZeroizeOnDrop, PartialEq, Eq)]
pub struct SecretKey(Vec<u8>);

impl SecretKey {
    /// Wraps key bytes.
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        Self(bytes)
    }

    /// The key bytes. Callers must not log or format them.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    /// Key length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True for a zero-length key.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretKey(<{} bytes redacted>)", self.0.len())
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests may block")]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_key_bytes() {
        let key = SecretKey::from_bytes(b"supersecretvalue".to_vec());
        let s = format!("{key:?}");
        assert!(!s.contains("supersecret"), "{s}");
        assert!(s.contains("16 bytes"));
    }
}
