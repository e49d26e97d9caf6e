//! PME key material ("PKMT1") as PyArrow and parquet-java write it.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// One key material record. Internal material sits in the file's key metadata;
/// external material is a reference (`keyReference`) into a side file.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyMaterial {
    /// Always `PKMT1`.
    pub key_material_type: String,
    /// True when the material is in the file itself.
    #[serde(default = "default_true")]
    pub internal_storage: bool,
    /// Reference into the side file, for external material.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_reference: Option<String>,
    /// Whether this is the footer key.
    #[serde(default)]
    pub is_footer_key: bool,
    /// Master key id in the KMS.
    #[serde(rename = "masterKeyID", default)]
    pub master_key_id: String,
    /// The DEK, wrapped by the KEK (double wrapping) or by the KMS.
    #[serde(rename = "wrappedDEK", default)]
    pub wrapped_dek: String,
    /// Whether a KEK sits between the DEK and the master key.
    #[serde(default)]
    pub double_wrapping: bool,
    /// base64 KEK id, the AAD of the DEK encryption.
    #[serde(
        rename = "keyEncryptionKeyID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub kek_id: Option<String>,
    /// The KEK wrapped by the KMS.
    #[serde(
        rename = "wrappedKEK",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub wrapped_kek: Option<String>,
}

fn default_true() -> bool {
    true
}

impl KeyMaterial {
    /// Parses key metadata bytes; `Ok(None)` when they are not JSON key material
    /// (parquet-testing's explicit-key files store a short key id instead).
    pub fn parse(metadata: &[u8], file: Option<&str>) -> Result<Option<Self>> {
        let Ok(text) = std::str::from_utf8(metadata) else {
            return Ok(None);
        };
        if !text.trim_start().starts_with('{') {
            return Ok(None);
        }
        let m: KeyMaterial = serde_json::from_str(text).map_err(|e| Error::KeyMaterial {
            file: file.map(Into::into),
            reason: e.to_string(),
        })?;
        if m.key_material_type != "PKMT1" {
            return Err(Error::KeyMaterial {
                file: file.map(Into::into),
                reason: format!("unsupported key material type '{}'", m.key_material_type),
            });
        }
        Ok(Some(m))
    }

    /// Validates that the fields needed to unwrap are present.
    pub fn check_complete(&self, file: Option<&str>) -> Result<()> {
        let bad = |reason: &str| Error::KeyMaterial {
            file: file.map(Into::into),
            reason: reason.into(),
        };
        if self.master_key_id.is_empty() {
            return Err(bad("masterKeyID missing"));
        }
        if self.wrapped_dek.is_empty() {
            return Err(bad("wrappedDEK missing"));
        }
        if self.double_wrapping && (self.kek_id.is_none() || self.wrapped_kek.is_none()) {
            return Err(bad("double wrapping without keyEncryptionKeyID/wrappedKEK"));
        }
        Ok(())
    }
}

/// Name of parquet-java's external key material side file for a data file name.
pub fn side_file_name(data_file_name: &str) -> String {
    format!("_KEY_MATERIAL_FOR_{data_file_name}.json")
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests may block")]
mod tests {
    use super::*;

    #[test]
    fn parses_pyarrow_internal_material() {
        let m = KeyMaterial::parse(br#"{"keyMaterialType":"PKMT1","internalStorage":true,"isFooterKey":false,"masterKeyID":"pii_key","wrappedDEK":"AA==","doubleWrapping":true,"keyEncryptionKeyID":"AA==","wrappedKEK":"AA=="}"#, None)
            .unwrap()
            .unwrap();
        assert_eq!(m.master_key_id, "pii_key");
        assert!(m.double_wrapping && m.internal_storage);
    }

    #[test]
    fn short_key_id_is_not_material() {
        assert!(KeyMaterial::parse(b"kc1", None).unwrap().is_none());
    }

    #[test]
    fn malformed_json_names_the_file() {
        let e = KeyMaterial::parse(b"{\"keyMaterialType\":", Some("f.parquet"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("f.parquet"), "{e}");
    }
}
