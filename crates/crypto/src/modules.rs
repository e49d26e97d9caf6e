//! Parquet Modular Encryption (PME) modules: their types, AADs and ciphers.
//!
//! A PME file is a sequence of *modules* (footer, column metadata, page headers, pages,
//! page indexes, Bloom filters). Each is stored as a 4-byte little-endian length followed
//! by `nonce || ciphertext || tag` (AES-GCM) or `nonce || ciphertext` (AES-CTR, used for
//! data and dictionary pages of `AES_GCM_CTR_V1` files). Its AAD binds it to its place:
//! `aad_prefix || aad_file_unique || module type || row group || column || page`.
//!
//! [`ModuleCipher`] decrypts many modules under one data key (the key schedule is set up
//! once); it is what the local provider and the released-key fast path of the reader use.

use aes_gcm::aead::{AeadInPlace, KeyInit};
use aes_gcm::aes::{Aes128, Aes192, Aes256};
use aes_gcm::{AesGcm, Nonce, Tag};
use ctr::cipher::{KeyIvInit, StreamCipher};
use ring::aead::{AES_128_GCM, AES_256_GCM, Aad, LessSafeKey, UnboundKey};
use zeroize::Zeroizing;

type Aes192Gcm = AesGcm<Aes192, aes_gcm::aead::consts::U12>;

/// Length of the little-endian length prefix of every module.
pub const LENGTH_LEN: usize = 4;
/// AES-GCM and AES-CTR nonce length in PME.
pub const NONCE_LEN: usize = 12;
/// AES-GCM tag length.
pub const TAG_LEN: usize = 16;
/// Bytes an AES-GCM module adds to its plaintext (length, nonce, tag).
pub const GCM_OVERHEAD: usize = LENGTH_LEN + NONCE_LEN + TAG_LEN;
/// Bytes an AES-CTR module adds to its plaintext (length, nonce).
pub const CTR_OVERHEAD: usize = LENGTH_LEN + NONCE_LEN;

/// PME module types, numbered as in the AAD (Parquet `Encryption.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum ModuleType {
    /// File footer (`FileMetaData`).
    Footer = 0,
    /// A column chunk's `ColumnMetaData`.
    ColumnMetaData = 1,
    /// Data page contents.
    DataPage = 2,
    /// Dictionary page contents.
    DictionaryPage = 3,
    /// Data page header.
    DataPageHeader = 4,
    /// Dictionary page header.
    DictionaryPageHeader = 5,
    /// Column index (page index).
    ColumnIndex = 6,
    /// Offset index (page index).
    OffsetIndex = 7,
    /// Bloom filter header.
    BloomFilterHeader = 8,
    /// Bloom filter bitset.
    BloomFilterBitset = 9,
}

impl ModuleType {
    /// The type of a PME module type code (0 footer .. 9 bloom filter bitset).
    pub fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => Self::Footer,
            1 => Self::ColumnMetaData,
            2 => Self::DataPage,
            3 => Self::DictionaryPage,
            4 => Self::DataPageHeader,
            5 => Self::DictionaryPageHeader,
            6 => Self::ColumnIndex,
            7 => Self::OffsetIndex,
            8 => Self::BloomFilterHeader,
            9 => Self::BloomFilterBitset,
            _ => return None,
        })
    }

    /// Name used in errors and the audit log.
    pub fn name(self) -> &'static str {
        match self {
            Self::Footer => "footer",
            Self::ColumnMetaData => "column metadata",
            Self::DataPage => "data page",
            Self::DictionaryPage => "dictionary page",
            Self::DataPageHeader => "data page header",
            Self::DictionaryPageHeader => "dictionary page header",
            Self::ColumnIndex => "column index",
            Self::OffsetIndex => "offset index",
            Self::BloomFilterHeader => "bloom filter header",
            Self::BloomFilterBitset => "bloom filter bitset",
        }
    }

    /// Whether the AAD carries a page ordinal.
    pub fn has_page_ordinal(self) -> bool {
        matches!(self, Self::DataPage | Self::DataPageHeader)
    }
}

impl std::fmt::Display for ModuleType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// PME algorithm of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Every module AES-GCM.
    AesGcmV1,
    /// Data and dictionary pages AES-CTR, every other module AES-GCM.
    AesGcmCtrV1,
}

impl Algorithm {
    /// The name in the Parquet spec (`AES_GCM_V1`, `AES_GCM_CTR_V1`).
    pub fn name(self) -> &'static str {
        match self {
            Self::AesGcmV1 => "AES_GCM_V1",
            Self::AesGcmCtrV1 => "AES_GCM_CTR_V1",
        }
    }

    /// Whether modules of `kind` are AES-CTR under this algorithm.
    pub fn is_ctr(self, kind: ModuleType) -> bool {
        self == Self::AesGcmCtrV1
            && matches!(kind, ModuleType::DataPage | ModuleType::DictionaryPage)
    }

    /// Bytes a module of `kind` adds to its plaintext (length prefix included).
    pub fn overhead(self, kind: ModuleType) -> usize {
        if self.is_ctr(kind) {
            CTR_OVERHEAD
        } else {
            GCM_OVERHEAD
        }
    }
}

/// Position of a module in its file, for its AAD and for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ModulePosition {
    /// Module type.
    pub kind: ModuleType,
    /// Row group ordinal (not for the footer).
    pub row_group: usize,
    /// Column ordinal (not for the footer).
    pub column: usize,
    /// Page ordinal (data pages and their headers only).
    pub page: usize,
}

impl ModulePosition {
    /// The footer.
    pub fn footer() -> Self {
        Self {
            kind: ModuleType::Footer,
            row_group: 0,
            column: 0,
            page: 0,
        }
    }

    /// A module of a column chunk (`page` is ignored unless the type has an ordinal).
    pub fn new(kind: ModuleType, row_group: usize, column: usize, page: usize) -> Self {
        Self {
            kind,
            row_group,
            column,
            page,
        }
    }

    /// The module's AAD given the file AAD (`aad_prefix || aad_file_unique`).
    /// `None` when an ordinal does not fit the 16-bit field of the spec.
    pub fn aad(&self, file_aad: &[u8]) -> Option<Vec<u8>> {
        let mut aad = Vec::with_capacity(file_aad.len() + 7);
        aad.extend_from_slice(file_aad);
        aad.push(self.kind as u8);
        if self.kind == ModuleType::Footer {
            return Some(aad);
        }
        let ordinal = |n: usize| i16::try_from(n).ok().map(i16::to_le_bytes);
        aad.extend_from_slice(&ordinal(self.row_group)?);
        aad.extend_from_slice(&ordinal(self.column)?);
        if self.kind.has_page_ordinal() {
            aad.extend_from_slice(&ordinal(self.page)?);
        }
        Some(aad)
    }
}

/// Why a module did not decrypt (no detail about keys on purpose).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ModuleError {
    /// The data key is not 16, 24 or 32 bytes.
    #[error("data key is not 128, 192 or 256 bits")]
    KeyLength,
    /// Shorter than its nonce (and tag).
    #[error("module is truncated")]
    Truncated,
    /// The tag does not verify: wrong key, wrong AAD, or tampered bytes.
    #[error("authentication failed (wrong key, wrong AAD prefix, or tampered/moved module)")]
    Authentication,
}

impl ModuleError {
    /// Code on the wire (remote protocol).
    pub fn code(self) -> &'static str {
        match self {
            Self::KeyLength => "key_length",
            Self::Truncated => "truncated",
            Self::Authentication => "authentication",
        }
    }

    /// From a wire code; unknown codes read as authentication failures.
    pub fn from_code(code: &str) -> Self {
        match code {
            "key_length" => Self::KeyLength,
            "truncated" => Self::Truncated,
            _ => Self::Authentication,
        }
    }
}

/// AES-GCM: `ring` for 128 and 256-bit keys (about 6x the throughput of the `aes-gcm`
/// crate on the dev VM, `benches/benches/ciphers.rs`), RustCrypto for 192-bit keys, which
/// ring does not offer. ring does not zeroize its key schedule on drop; the key bytes
/// held here are.
enum Gcm {
    Ring(Box<LessSafeKey>),
    A192(Box<Aes192Gcm>),
}

/// Ciphers of one data key, set up once, for many modules.
pub struct ModuleCipher {
    gcm: Gcm,
    key: Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for ModuleCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ModuleCipher(AES-{})", self.key.len() * 8)
    }
}

impl ModuleCipher {
    /// Ciphers for a 128, 192 or 256-bit data key.
    pub fn new(key: &[u8]) -> Result<Self, ModuleError> {
        let ring_key = |alg| {
            UnboundKey::new(alg, key)
                .map(|k| Gcm::Ring(Box::new(LessSafeKey::new(k))))
                .map_err(|_| ModuleError::KeyLength)
        };
        let gcm = match key.len() {
            16 => ring_key(&AES_128_GCM)?,
            24 => Gcm::A192(Box::new(
                Aes192Gcm::new_from_slice(key).map_err(|_| ModuleError::KeyLength)?,
            )),
            32 => ring_key(&AES_256_GCM)?,
            _ => return Err(ModuleError::KeyLength),
        };
        Ok(Self {
            gcm,
            key: Zeroizing::new(key.to_vec()),
        })
    }

    /// Decrypts one module body (`nonce || ciphertext [|| tag]`, without the length
    /// prefix), appending the plaintext to `out`.
    pub fn decrypt_into(
        &self,
        algorithm: Algorithm,
        kind: ModuleType,
        aad: &[u8],
        body: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), ModuleError> {
        let ctr_file = algorithm == Algorithm::AesGcmCtrV1;
        if algorithm.is_ctr(kind) {
            let (nonce, ct) = body
                .split_at_checked(NONCE_LEN)
                .ok_or(ModuleError::Truncated)?;
            let start = out.len();
            out.extend_from_slice(ct);
            self.ctr(nonce, &mut out[start..]);
            clearice_metrics::decrypted(ctr_file, body.len());
            return Ok(());
        }
        if body.len() < NONCE_LEN + TAG_LEN {
            return Err(ModuleError::Truncated);
        }
        let (nonce, rest) = body.split_at(NONCE_LEN);
        let start = out.len();
        let ok = match &self.gcm {
            Gcm::Ring(k) => {
                // Ciphertext and tag in place; the tag is cut off after.
                out.extend_from_slice(rest);
                let nonce = ring::aead::Nonce::try_assume_unique_for_key(nonce)
                    .map_err(|_| ModuleError::Truncated)?;
                let ok = k
                    .open_in_place(nonce, Aad::from(aad), &mut out[start..])
                    .is_ok();
                out.truncate(out.len() - TAG_LEN);
                ok
            }
            Gcm::A192(c) => {
                let (ct, tag) = rest.split_at(rest.len() - TAG_LEN);
                out.extend_from_slice(ct);
                let (nonce, tag) = (Nonce::from_slice(nonce), Tag::from_slice(tag));
                c.decrypt_in_place_detached(nonce, aad, &mut out[start..], tag)
                    .is_ok()
            }
        };
        if !ok {
            out.truncate(start);
            return Err(ModuleError::Authentication);
        }
        clearice_metrics::decrypted(ctr_file, body.len());
        Ok(())
    }

    /// Decrypts the module body at `buf[body]` (`nonce || ciphertext [|| tag]`) into
    /// `buf[dst..]`, at most where the ciphertext starts (`dst <= body.start + 12`; there,
    /// in place), without another buffer; returns the plaintext length. Bytes between the
    /// plaintext's end and `body.end` are left unspecified.
    pub fn decrypt_within(
        &self,
        algorithm: Algorithm,
        kind: ModuleType,
        aad: &[u8],
        buf: &mut [u8],
        body: std::ops::Range<usize>,
        dst: usize,
    ) -> Result<usize, ModuleError> {
        // Counted once decrypted (a module that fails authentication is not).
        let counted = |n: usize| {
            clearice_metrics::decrypted(algorithm == Algorithm::AesGcmCtrV1, body.len());
            n
        };
        let ctr = algorithm.is_ctr(kind);
        let min = if ctr { NONCE_LEN } else { NONCE_LEN + TAG_LEN };
        if body.len() < min || dst > body.start + NONCE_LEN || body.end > buf.len() {
            return Err(ModuleError::Truncated);
        }
        let nonce: [u8; NONCE_LEN] = buf[body.start..body.start + NONCE_LEN]
            .try_into()
            .expect("12 bytes");
        let ct = body.start + NONCE_LEN..body.end;
        // In place (`dst` at the ciphertext), nothing moves.
        let shift = |buf: &mut [u8], from: std::ops::Range<usize>| {
            if from.start != dst {
                buf.copy_within(from, dst);
            }
        };
        if ctr {
            let n = ct.len();
            shift(buf, ct);
            self.ctr(&nonce, &mut buf[dst..dst + n]);
            return Ok(counted(n));
        }
        match &self.gcm {
            Gcm::Ring(k) => k
                .open_within(
                    ring::aead::Nonce::assume_unique_for_key(nonce),
                    Aad::from(aad),
                    &mut buf[dst..body.end],
                    ct.start - dst..,
                )
                .map(|p| counted(p.len()))
                .map_err(|_| ModuleError::Authentication),
            Gcm::A192(c) => {
                let n = ct.len() - TAG_LEN;
                let tag: [u8; TAG_LEN] =
                    buf[ct.end - TAG_LEN..ct.end].try_into().expect("16 bytes");
                shift(buf, ct.start..ct.start + n);
                c.decrypt_in_place_detached(
                    Nonce::from_slice(&nonce),
                    aad,
                    &mut buf[dst..dst + n],
                    Tag::from_slice(&tag),
                )
                .map(|()| counted(n))
                .map_err(|_| ModuleError::Authentication)
            }
        }
    }

    /// Decrypts one module body into a new buffer.
    pub fn decrypt(
        &self,
        algorithm: Algorithm,
        kind: ModuleType,
        aad: &[u8],
        body: &[u8],
    ) -> Result<Vec<u8>, ModuleError> {
        let mut out = Vec::with_capacity(body.len());
        self.decrypt_into(algorithm, kind, aad, body, &mut out)?;
        Ok(out)
    }

    /// Encrypts one module with `nonce`, returning its body (`nonce || ciphertext [|| tag]`,
    /// no length prefix).
    pub fn encrypt(
        &self,
        algorithm: Algorithm,
        kind: ModuleType,
        aad: &[u8],
        nonce: &[u8; NONCE_LEN],
        plaintext: &[u8],
    ) -> Result<Vec<u8>, ModuleError> {
        let mut out = Vec::with_capacity(NONCE_LEN + plaintext.len() + TAG_LEN);
        out.extend_from_slice(nonce);
        out.extend_from_slice(plaintext);
        if algorithm.is_ctr(kind) {
            self.ctr(nonce, &mut out[NONCE_LEN..]);
            return Ok(out);
        }
        let buf = &mut out[NONCE_LEN..];
        let tag: [u8; TAG_LEN] = match &self.gcm {
            Gcm::Ring(k) => {
                let n = ring::aead::Nonce::assume_unique_for_key(*nonce);
                let tag = k
                    .seal_in_place_separate_tag(n, Aad::from(aad), buf)
                    .map_err(|_| ModuleError::Authentication)?;
                tag.as_ref()
                    .try_into()
                    .map_err(|_| ModuleError::Authentication)?
            }
            Gcm::A192(c) => c
                .encrypt_in_place_detached(Nonce::from_slice(nonce), aad, buf)
                .map_err(|_| ModuleError::Authentication)?
                .into(),
        };
        out.extend_from_slice(&tag);
        Ok(out)
    }

    /// PME's CTR: a 16-byte IV of the 12-byte nonce and a 32-bit big-endian counter
    /// starting at 1.
    fn ctr(&self, nonce: &[u8], buf: &mut [u8]) {
        let mut iv = [0u8; 16];
        iv[..NONCE_LEN].copy_from_slice(nonce);
        iv[15] = 1;
        match self.key.len() {
            16 => {
                ctr::Ctr32BE::<Aes128>::new(self.key[..].into(), (&iv).into()).apply_keystream(buf)
            }
            24 => {
                ctr::Ctr32BE::<Aes192>::new(self.key[..].into(), (&iv).into()).apply_keystream(buf)
            }
            _ => {
                ctr::Ctr32BE::<Aes256>::new(self.key[..].into(), (&iv).into()).apply_keystream(buf)
            }
        }
    }
}

/// Splits a module off the front of `bytes`: its body (without the length prefix) and
/// the rest. `None` when the length prefix or the body is cut short.
pub fn split_module(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let len = u32::from_le_bytes(bytes.get(..LENGTH_LEN)?.try_into().ok()?) as usize;
    let rest = &bytes[LENGTH_LEN..];
    (rest.len() >= len).then(|| rest.split_at(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aad_layout_matches_the_spec() {
        let p = ModulePosition::new(ModuleType::DataPage, 1, 2, 3);
        assert_eq!(p.aad(b"F").unwrap(), b"F\x02\x01\x00\x02\x00\x03\x00");
        let p = ModulePosition::new(ModuleType::DictionaryPage, 1, 2, 3);
        assert_eq!(p.aad(b"F").unwrap(), b"F\x03\x01\x00\x02\x00");
        assert_eq!(ModulePosition::footer().aad(b"F").unwrap(), b"F\x00");
        assert!(
            ModulePosition::new(ModuleType::DataPage, 40_000, 0, 0)
                .aad(b"")
                .is_none()
        );
    }

    #[test]
    fn gcm_and_ctr_round_trip_for_every_key_length() {
        for len in [16, 24, 32] {
            let c = ModuleCipher::new(&vec![7u8; len]).unwrap();
            for (alg, kind) in [
                (Algorithm::AesGcmV1, ModuleType::DataPage),
                (Algorithm::AesGcmCtrV1, ModuleType::DataPage),
                (Algorithm::AesGcmCtrV1, ModuleType::DataPageHeader),
            ] {
                let body = c.encrypt(alg, kind, b"aad", &[1; 12], b"hello").unwrap();
                assert_eq!(body.len() + LENGTH_LEN, 5 + alg.overhead(kind));
                assert_eq!(c.decrypt(alg, kind, b"aad", &body).unwrap(), b"hello");
                if !alg.is_ctr(kind) {
                    assert_eq!(
                        c.decrypt(alg, kind, b"other", &body),
                        Err(ModuleError::Authentication)
                    );
                }
            }
        }
        assert!(ModuleCipher::new(&[0; 15]).is_err());
    }

    #[test]
    fn decrypt_within_compacts_modules_in_place() {
        for len in [16, 24, 32] {
            let c = ModuleCipher::new(&vec![5u8; len]).unwrap();
            for alg in [Algorithm::AesGcmV1, Algorithm::AesGcmCtrV1] {
                let a = c
                    .encrypt(alg, ModuleType::DataPage, b"a", &[1; 12], b"first")
                    .unwrap();
                let b = c
                    .encrypt(alg, ModuleType::DataPage, b"b", &[2; 12], b"second!")
                    .unwrap();
                let mut buf = [a.clone(), b.clone()].concat();
                let n = c
                    .decrypt_within(alg, ModuleType::DataPage, b"a", &mut buf, 0..a.len(), 0)
                    .unwrap();
                let m = c
                    .decrypt_within(
                        alg,
                        ModuleType::DataPage,
                        b"b",
                        &mut buf,
                        a.len()..a.len() + b.len(),
                        n,
                    )
                    .unwrap();
                assert_eq!(&buf[..n + m], b"firstsecond!");
                // Where the ciphertext lies (the crypto service's request buffer); no
                // further, where it would overwrite the ciphertext before reading it.
                let mut buf = [a.clone(), b.clone()].concat();
                let at = a.len() + NONCE_LEN;
                let body = a.len()..a.len() + b.len();
                let m = c
                    .decrypt_within(alg, ModuleType::DataPage, b"b", &mut buf, body.clone(), at)
                    .unwrap();
                assert_eq!(
                    (&buf[..a.len()], &buf[at..at + m]),
                    (&a[..], &b"second!"[..])
                );
                let mut buf = [a.clone(), b.clone()].concat();
                assert_eq!(
                    c.decrypt_within(alg, ModuleType::DataPage, b"b", &mut buf, body, at + 1),
                    Err(ModuleError::Truncated)
                );
                if alg == Algorithm::AesGcmV1 {
                    let mut bad = b.clone();
                    assert_eq!(
                        c.decrypt_within(alg, ModuleType::DataPage, b"x", &mut bad, 0..b.len(), 0),
                        Err(ModuleError::Authentication)
                    );
                }
            }
        }
    }

    #[test]
    fn ctr_counter_starts_at_one() {
        // The first keystream block is AES(key, nonce || 00 00 00 01).
        use aes_gcm::aes::cipher::{BlockEncrypt, generic_array::GenericArray};
        let key = [3u8; 16];
        let c = ModuleCipher::new(&key).unwrap();
        let body = c
            .encrypt(
                Algorithm::AesGcmCtrV1,
                ModuleType::DataPage,
                b"",
                &[9; 12],
                &[0; 16],
            )
            .unwrap();
        let mut block = [9u8; 16];
        block[12..].copy_from_slice(&[0, 0, 0, 1]);
        let mut block = GenericArray::from(block);
        Aes128::new(&key.into()).encrypt_block(&mut block);
        assert_eq!(&body[NONCE_LEN..], block.as_slice());
    }
}
