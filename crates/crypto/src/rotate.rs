//! Master key rotation without touching data files (parquet-java's `KeyToolkit.rotateMasterKeys`
//! semantics): the data keys (DEKs) stay, only their wrapping changes. Every key material
//! record under the master key in an external key material side file is re-wrapped with
//! a fresh KEK under the KMS's current version of the master key. Files with internal key
//! material cannot be rotated this way (their material is inside the file): the KMS keeps
//! the old version for them.

use std::collections::BTreeMap;

use base64::Engine;
use base64::prelude::BASE64_STANDARD;

use crate::aes;
use crate::error::{Error, Result};
use crate::key_material::KeyMaterial;
use crate::kms::Kms;
use crate::resolver::KeyResolver;

/// Re-wraps the records of `side_file` (a side file's JSON text) that name
/// `master_key_id`; returns the new text and how many records changed (`0`: leave the
/// file alone). `path` names the file in errors.
pub async fn rotate_side_file(
    side_file: &str,
    path: &str,
    master_key_id: &str,
    resolver: &KeyResolver,
    kms: &dyn Kms,
) -> Result<(String, usize)> {
    let bad = |reason: String| Error::ExternalKeyMaterial {
        path: path.into(),
        reason,
    };
    let map: BTreeMap<String, String> =
        serde_json::from_str(side_file).map_err(|e| bad(format!("not a JSON object: {e}")))?;
    // One fresh KEK per file, as the writers make them.
    let kek = rand::random::<[u8; 16]>();
    let kek_id = BASE64_STANDARD.encode(rand::random::<[u8; 16]>());
    let mut wrapped_kek = None;
    let mut out = BTreeMap::new();
    let mut changed = 0;
    for (reference, text) in map {
        let material = KeyMaterial::parse(text.as_bytes(), Some(path))?
            .ok_or_else(|| bad(format!("entry '{reference}' is not key material")))?;
        if material.master_key_id != master_key_id {
            out.insert(reference, text);
            continue;
        }
        let dek = resolver.data_key(&material, Some(path)).await?;
        let mut v: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&text).map_err(|e| bad(format!("entry '{reference}': {e}")))?;
        if material.double_wrapping {
            let wk = match &wrapped_kek {
                Some(w) => w,
                None => wrapped_kek.insert(kms.wrap_key(&kek, master_key_id).await?),
            };
            let aad = BASE64_STANDARD.decode(&kek_id).expect("own base64");
            let wrapped_dek = aes::encrypt(&kek, &aes::random_nonce(), dek.expose(), &aad)
                .map_err(|_| Error::Wrap {
                    kms: "local".into(),
                    key_id: master_key_id.into(),
                })?;
            v.insert(
                "wrappedDEK".into(),
                BASE64_STANDARD.encode(wrapped_dek).into(),
            );
            v.insert("keyEncryptionKeyID".into(), kek_id.clone().into());
            v.insert("wrappedKEK".into(), wk.clone().into());
        } else {
            v.insert(
                "wrappedDEK".into(),
                kms.wrap_key(dek.expose(), master_key_id).await?.into(),
            );
        }
        out.insert(
            reference,
            serde_json::to_string(&v).expect("json map serializes"),
        );
        changed += 1;
    }
    let text = serde_json::to_string(&out).expect("string map serializes");
    Ok((text, changed))
}
