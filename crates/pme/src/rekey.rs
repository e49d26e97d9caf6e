//! Writing through a crypto provider that keeps its keys: parquet-rs writes the file with
//! stand-in data keys (random, in memory only) and the provider's real key material;
//! then every module under a stand-in key (column metadata, page headers, pages, column
//! and offset index) is decrypted with it and encrypted again **by the provider** under
//! the real key, with the same AAD. AES-GCM's overhead is fixed, so every module keeps its
//! length and offset; only the footer (under the local footer key) is re-encrypted with
//! the new column metadata. One provider call per column chunk.
#![allow(
    deprecated,
    reason = "parquet::format holds parquet 58's only public Thrift types (removed in 59)"
)]

use std::collections::HashMap;

use bytes::Bytes;
use clearice_crypto::{
    Algorithm, CallContext, Module, ModuleBatch, ModuleCipher, ModulePosition, ModuleType,
    ProviderRef, SecretKey, aes::random_nonce,
};
use parquet::format::{
    ColumnCryptoMetaData, ColumnMetaData, EncryptionAlgorithm, FileCryptoMetaData, FileMetaData,
};

use super::compact;

/// A column key held by a provider, and the stand-in the file was written with.
#[derive(Debug)]
pub struct ProviderColumnKey {
    /// The stand-in data key.
    pub stand_in: SecretKey,
    /// The provider's key material (already in the file as the column's key metadata).
    pub key_metadata: Bytes,
    /// The provider.
    pub provider: ProviderRef,
}

/// Where a module's body is: in the file, or in a column chunk's encrypted metadata.
enum At {
    File(usize),
    ColumnMetaData(usize, usize),
}

/// Re-encrypts `file` (a whole PME file, encrypted footer, AES_GCM_V1) through the
/// providers of `keys`; `footer_key` is the file's (local) footer key. Returns the number
/// of modules the providers encrypted.
pub async fn rekey(
    file: &mut Vec<u8>,
    footer_key: &SecretKey,
    aad_prefix: Option<&[u8]>,
    keys: &[ProviderColumnKey],
    ctx: &CallContext,
) -> Result<usize, String> {
    let len = file.len();
    if len < 12 || &file[len - 4..] != b"PARE" {
        return Err("not a PME file with an encrypted footer (providers need one)".into());
    }
    let footer_len =
        u32::from_le_bytes(file[len - 8..len - 4].try_into().expect("4 bytes")) as usize;
    let footer_start = len
        .checked_sub(8 + footer_len)
        .ok_or("footer length exceeds the file")?;
    let footer = file[footer_start..len - 8].to_vec();
    let mut rest = &footer[..];
    let crypto: FileCryptoMetaData = compact::read(&mut rest)?;
    let consumed = footer.len() - rest.len();
    let EncryptionAlgorithm::AESGCMV1(alg) = &crypto.encryption_algorithm else {
        return Err("only AES_GCM_V1 files are written through providers".into());
    };
    let mut file_aad = alg
        .aad_prefix
        .clone()
        .or_else(|| aad_prefix.map(<[u8]>::to_vec))
        .unwrap_or_default();
    file_aad.extend_from_slice(alg.aad_file_unique.as_deref().unwrap_or_default());
    let aad = |p: ModulePosition| p.aad(&file_aad).ok_or("module position without AAD");
    let footer_cipher = ModuleCipher::new(footer_key.expose()).map_err(|e| e.to_string())?;
    let (body, _) = clearice_crypto::modules::split_module(&footer[consumed..])
        .ok_or("footer module is truncated")?;
    let plain = footer_cipher
        .decrypt(
            Algorithm::AesGcmV1,
            ModuleType::Footer,
            &aad(ModulePosition::footer())?,
            body,
        )
        .map_err(|e| format!("footer: {e}"))?;
    let mut meta: FileMetaData = compact::read(&mut &plain[..])?;

    let by_metadata: HashMap<&[u8], &ProviderColumnKey> =
        keys.iter().map(|k| (k.key_metadata.as_ref(), k)).collect();
    let mut described = HashMap::new();
    let mut total = 0;
    for rg in 0..meta.row_groups.len() {
        for col in 0..meta.row_groups[rg].columns.len() {
            let chunk = &meta.row_groups[rg].columns[col];
            let Some(ColumnCryptoMetaData::ENCRYPTIONWITHCOLUMNKEY(ck)) = &chunk.crypto_metadata
            else {
                continue;
            };
            let Some(key) = ck.key_metadata.as_deref().and_then(|m| by_metadata.get(m)) else {
                continue;
            };
            let path = ck.path_in_schema.join(".");
            let stand_in = ModuleCipher::new(key.stand_in.expose()).map_err(|e| e.to_string())?;
            let mut modules: Vec<(At, usize, Module)> = Vec::new();
            let open = |body: &[u8], position: ModulePosition| -> Result<Module, String> {
                let a = aad(position)?;
                let plain = stand_in
                    .decrypt(Algorithm::AesGcmV1, position.kind, &a, body)
                    .map_err(|e| format!("{path}: {} {e}", position.kind.name()))?;
                Ok(Module {
                    position,
                    aad: a,
                    data: Bytes::from(plain),
                    nonce: None,
                })
            };
            // Column metadata (inside the footer).
            let enc = chunk
                .encrypted_column_metadata
                .as_deref()
                .ok_or_else(|| format!("{path}: no encrypted column metadata"))?;
            let (cmd_body, _) = clearice_crypto::modules::split_module(enc)
                .ok_or_else(|| format!("{path}: column metadata truncated"))?;
            let cmd_pos = ModulePosition::new(ModuleType::ColumnMetaData, rg, col, 0);
            modules.push((
                At::ColumnMetaData(rg, col),
                cmd_body.len(),
                open(cmd_body, cmd_pos)?,
            ));
            let cmd: ColumnMetaData = compact::read(&mut &modules[0].2.data[..])?;
            // Pages: [header module][page module]..., the dictionary first if any.
            let dict = cmd.dictionary_page_offset.filter(|o| *o > 0);
            let start = dict.unwrap_or(cmd.data_page_offset) as usize;
            let end = start + cmd.total_compressed_size as usize;
            let (mut pos, mut page, mut in_dict) = (start, 0, dict.is_some());
            while pos < end {
                let kinds = if in_dict {
                    [ModuleType::DictionaryPageHeader, ModuleType::DictionaryPage]
                } else {
                    [ModuleType::DataPageHeader, ModuleType::DataPage]
                };
                for kind in kinds {
                    let n = file
                        .get(pos..pos + 4)
                        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
                        .ok_or_else(|| format!("{path}: page module beyond the file"))?;
                    let body = file
                        .get(pos + 4..pos + 4 + n)
                        .ok_or_else(|| format!("{path}: page module beyond the file"))?;
                    modules.push((
                        At::File(pos + 4),
                        n,
                        open(body, ModulePosition::new(kind, rg, col, page))?,
                    ));
                    pos += 4 + n;
                }
                if in_dict {
                    in_dict = false;
                } else {
                    page += 1;
                }
            }
            // Page index.
            for (offset, kind) in [
                (chunk.column_index_offset, ModuleType::ColumnIndex),
                (chunk.offset_index_offset, ModuleType::OffsetIndex),
            ] {
                let Some(offset) = offset else { continue };
                let offset = offset as usize;
                let n = file
                    .get(offset..offset + 4)
                    .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
                    .ok_or_else(|| format!("{path}: {} beyond the file", kind.name()))?;
                let body = file
                    .get(offset + 4..offset + 4 + n)
                    .ok_or_else(|| format!("{path}: {} beyond the file", kind.name()))?;
                modules.push((
                    At::File(offset + 4),
                    n,
                    open(body, ModulePosition::new(kind, rg, col, 0))?,
                ));
            }
            // The provider encrypts the chunk's modules under the real key.
            let key_ref = match described.get(&key.key_metadata) {
                Some(k) => Clone::clone(k),
                None => {
                    let k = key
                        .provider
                        .describe_key(ctx, key.key_metadata.clone())
                        .await
                        .map_err(|e| e.to_string())?;
                    described.insert(key.key_metadata.clone(), k.clone());
                    k
                }
            };
            let (places, batch): (Vec<(At, usize)>, Vec<Module>) =
                modules.into_iter().map(|(at, n, m)| ((at, n), m)).unzip();
            let bodies = key
                .provider
                .encrypt(
                    ctx,
                    ModuleBatch {
                        key: key_ref,
                        algorithm: Algorithm::AesGcmV1,
                        column: Some(path.clone()),
                        modules: batch,
                    },
                )
                .await
                .map_err(|e| e.to_string())?;
            if bodies.len() != places.len() {
                return Err(format!(
                    "{path}: the provider answered {} of {} modules",
                    bodies.len(),
                    places.len()
                ));
            }
            for ((at, n), body) in places.into_iter().zip(bodies) {
                if body.len() != n {
                    return Err(format!(
                        "{path}: the provider's module has {} bytes, expected {n}",
                        body.len()
                    ));
                }
                match at {
                    At::File(offset) => file[offset..offset + n].copy_from_slice(&body),
                    At::ColumnMetaData(r, c) => {
                        let mut framed = (n as u32).to_le_bytes().to_vec();
                        framed.extend_from_slice(&body);
                        meta.row_groups[r].columns[c].encrypted_column_metadata = Some(framed);
                    }
                }
                total += 1;
            }
        }
    }
    // The footer again, under the local footer key, with the new column metadata.
    let plain = compact::write(&meta);
    let body = footer_cipher
        .encrypt(
            Algorithm::AesGcmV1,
            ModuleType::Footer,
            &aad(ModulePosition::footer())?,
            &random_nonce(),
            &plain,
        )
        .map_err(|e| format!("footer: {e}"))?;
    file.truncate(footer_start);
    file.extend_from_slice(&footer[..consumed]);
    file.extend_from_slice(&(body.len() as u32).to_le_bytes());
    file.extend_from_slice(&body);
    let new_len = consumed + 4 + body.len();
    file.extend_from_slice(&(new_len as u32).to_le_bytes());
    file.extend_from_slice(b"PARE");
    Ok(total)
}
