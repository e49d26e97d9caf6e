//! Key material for writing: fresh DEKs wrapped with double wrapping, as PyArrow and
//! parquet-java write them (one KEK per master key per file), so both read our files.

use std::collections::HashMap;

use base64::Engine;
use base64::prelude::BASE64_STANDARD;

use crate::aes;
use crate::error::{Error, Result};
use crate::kms::Kms;
use crate::secret::SecretKey;

struct Kek {
    key: SecretKey,
    id_b64: String,
    wrapped: String,
}

/// Creates data keys and their PKMT1 key material for one file.
pub struct KeyMaterialWriter<'a> {
    kms: &'a dyn Kms,
    keks: HashMap<String, Kek>,
}

impl std::fmt::Debug for KeyMaterialWriter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyMaterialWriter")
            .field("kms", &self.kms.name())
            .finish_non_exhaustive()
    }
}

impl<'a> KeyMaterialWriter<'a> {
    /// A writer for one file.
    pub fn new(kms: &'a dyn Kms) -> Self {
        Self {
            kms,
            keks: HashMap::new(),
        }
    }

    /// A fresh 128-bit DEK under `master_key_id`, and its key material (JSON bytes).
    pub async fn data_key(
        &mut self,
        master_key_id: &str,
        is_footer_key: bool,
    ) -> Result<(SecretKey, Vec<u8>)> {
        if !self.keks.contains_key(master_key_id) {
            let key = SecretKey::from_bytes(rand::random::<[u8; 16]>().to_vec());
            let wrapped = self.kms.wrap_key(key.expose(), master_key_id).await?;
            let id_b64 = BASE64_STANDARD.encode(rand::random::<[u8; 16]>());
            self.keks.insert(
                master_key_id.to_owned(),
                Kek {
                    key,
                    id_b64,
                    wrapped,
                },
            );
        }
        let kek = &self.keks[master_key_id];
        let dek = SecretKey::from_bytes(rand::random::<[u8; 16]>().to_vec());
        let aad = BASE64_STANDARD.decode(&kek.id_b64).expect("own base64");
        let wrapped_dek = aes::encrypt(kek.key.expose(), &aes::random_nonce(), dek.expose(), &aad)
            .map_err(|_| Error::Wrap {
                kms: "local".into(),
                key_id: master_key_id.into(),
            })?;
        let mut m = serde_json::Map::new();
        m.insert("keyMaterialType".into(), "PKMT1".into());
        m.insert("internalStorage".into(), true.into());
        m.insert("isFooterKey".into(), is_footer_key.into());
        if is_footer_key {
            m.insert("kmsInstanceID".into(), "DEFAULT".into());
            m.insert("kmsInstanceURL".into(), "DEFAULT".into());
        }
        m.insert("masterKeyID".into(), master_key_id.into());
        m.insert(
            "wrappedDEK".into(),
            BASE64_STANDARD.encode(wrapped_dek).into(),
        );
        m.insert("doubleWrapping".into(), true.into());
        m.insert("keyEncryptionKeyID".into(), kek.id_b64.clone().into());
        m.insert("wrappedKEK".into(), kek.wrapped.clone().into());
        Ok((dek, serde_json::to_vec(&m).expect("json map serializes")))
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests may block")]
mod tests {
    use super::*;
    use crate::{KeyResolver, KeyringKms};
    use std::sync::Arc;

    #[tokio::test]
    async fn written_material_resolves_back_to_the_same_key_with_one_kek_per_master_key() {
        let kms = KeyringKms::from_json(r#"{"m":"MDEyMzQ1Njc4OTAxMjM0NQ=="}"#).unwrap();
        let mut w = KeyMaterialWriter::new(&kms);
        let (k1, m1) = w.data_key("m", false).await.unwrap();
        let (k2, m2) = w.data_key("m", true).await.unwrap();
        assert_ne!(k1, k2);
        let r = Arc::new(KeyResolver::new(
            Some(Arc::new(kms)),
            Default::default(),
            crate::DEFAULT_KEY_CACHE_TTL,
        ));
        let f = r.retriever_for_file("f", None);
        assert_eq!(f.resolve(&m1).await.unwrap(), k1);
        assert_eq!(f.resolve(&m2).await.unwrap(), k2);
        assert_eq!(r.kms_unwrap_count(), 1);
    }
}
