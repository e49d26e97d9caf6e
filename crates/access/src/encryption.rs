//! A table's policy as the encryption of the files ClearIce writes.

use clearice_iceberg::write::EncryptionSpec;
use clearice_policy::TablePolicy;

/// The protection rules of a table's policy: footer key and per-column master keys.
pub fn encryption_spec(t: &TablePolicy) -> EncryptionSpec {
    EncryptionSpec {
        footer_key_id: t.footer_key.clone().unwrap_or_default(),
        column_keys: t
            .columns
            .iter()
            .filter_map(|(c, p)| Some((c.clone(), p.master_key.clone()?)))
            .collect(),
        plaintext_footer: t.plaintext_footer,
        aad_prefix: t.aad_prefix.as_ref().map(|p| p.as_bytes().to_vec()),
    }
}
