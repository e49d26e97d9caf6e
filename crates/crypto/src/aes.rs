//! AES-GCM with 128, 192 or 256-bit keys (the key length selects the variant).

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::aes::Aes192;
use aes_gcm::{Aes128Gcm, Aes256Gcm, AesGcm, Nonce};

type Aes192Gcm = AesGcm<Aes192, aes_gcm::aead::consts::U12>;

/// Nonce length of AES-GCM as PME and the key tools use it.
pub const NONCE_LEN: usize = 12;

/// Why an AES-GCM operation failed (no detail on purpose).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AesError {
    /// Key is not 16, 24 or 32 bytes.
    KeyLength,
    /// Ciphertext shorter than nonce + tag, or the tag does not verify.
    Authentication,
}

/// Encrypts `plaintext`, returning `nonce || ciphertext || tag`.
pub fn encrypt(
    key: &[u8],
    nonce: &[u8; NONCE_LEN],
    plaintext: &[u8],
    aad: &[u8],
) -> Result<Vec<u8>, AesError> {
    let nonce_ga = Nonce::from_slice(nonce);
    let payload = Payload {
        msg: plaintext,
        aad,
    };
    let ct = match key.len() {
        16 => Aes128Gcm::new_from_slice(key)
            .map_err(|_| AesError::KeyLength)?
            .encrypt(nonce_ga, payload),
        24 => Aes192Gcm::new_from_slice(key)
            .map_err(|_| AesError::KeyLength)?
            .encrypt(nonce_ga, payload),
        32 => Aes256Gcm::new_from_slice(key)
            .map_err(|_| AesError::KeyLength)?
            .encrypt(nonce_ga, payload),
        _ => return Err(AesError::KeyLength),
    }
    .map_err(|_| AesError::Authentication)?;
    let mut out = Vec::with_capacity(NONCE_LEN + ct.len());
    out.extend_from_slice(nonce);
    out.extend_from_slice(&ct);
    Ok(out)
}

/// Decrypts `nonce || ciphertext || tag`.
pub fn decrypt(key: &[u8], data: &[u8], aad: &[u8]) -> Result<Vec<u8>, AesError> {
    if data.len() < NONCE_LEN + 16 {
        return Err(AesError::Authentication);
    }
    let (nonce, ct) = data.split_at(NONCE_LEN);
    let nonce = Nonce::from_slice(nonce);
    let payload = Payload { msg: ct, aad };
    match key.len() {
        16 => Aes128Gcm::new_from_slice(key)
            .map_err(|_| AesError::KeyLength)?
            .decrypt(nonce, payload),
        24 => Aes192Gcm::new_from_slice(key)
            .map_err(|_| AesError::KeyLength)?
            .decrypt(nonce, payload),
        32 => Aes256Gcm::new_from_slice(key)
            .map_err(|_| AesError::KeyLength)?
            .decrypt(nonce, payload),
        _ => return Err(AesError::KeyLength),
    }
    .map_err(|_| AesError::Authentication)
}

/// Fresh random nonce.
pub fn random_nonce() -> [u8; NONCE_LEN] {
    rand::random()
}
