//! The footer: read, decrypted or its signature verified, and rewritten into the plaintext
//! [`View`] of the file (its metadata without crypto, the regions to decrypt, placeholders
//! for refused columns).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use clearice_crypto::modules::{GCM_OVERHEAD, NONCE_LEN, TAG_LEN, split_module};
use clearice_crypto::{Algorithm, Module, ModuleBatch, ModuleError, ModulePosition, ModuleType};
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use parquet::format::{
    ColumnCryptoMetaData, ColumnMetaData, CompressionCodec, EncryptionAlgorithm,
    FileCryptoMetaData, FileMetaData,
};

use crate::keys::{ColumnKey, EXPLICIT_KEY, column_path, leaf_types, top_level_fields};
use crate::pages::{FileCrypto, Region, RegionKind, relink};
use crate::reader::DecryptingReader;
use crate::{DecryptError, Result, compact};

/// Bytes read from the end of a file at first (footer and, often, page indexes).
const TAIL_PREFETCH: u64 = 64 * 1024;

pub(crate) struct View {
    pub(crate) metadata: Arc<ParquetMetaData>,
    /// Each column (of the first row group) and the master key id of its column key.
    pub(crate) column_keys: Vec<(String, Option<String>)>,
    pub(crate) crypto: Option<FileCrypto>,
}

/// `metadata` without statistics or column indexes for FLOAT and DOUBLE columns: Parquet
/// writers leave NaN out of their bounds, while DataFusion (as DuckDB and PostgreSQL)
/// orders NaN above every number, so `x > 3` pruned by a row group's or page's bounds
/// would drop the NaN rows it returns. Such columns are read, not pruned.
pub(crate) fn without_float_bounds(
    metadata: ParquetMetaData,
) -> parquet::errors::Result<ParquetMetaData> {
    use parquet::basic::Type as Physical;
    let is_float = |c: &parquet::file::metadata::ColumnChunkMetaData| {
        matches!(c.column_type(), Physical::FLOAT | Physical::DOUBLE)
    };
    if !metadata
        .row_groups()
        .iter()
        .any(|rg| rg.columns().iter().any(is_float))
    {
        return Ok(metadata);
    }
    let mut builder = metadata.into_builder();
    let row_groups = builder
        .take_row_groups()
        .into_iter()
        .map(|rg| {
            let mut rg = rg.into_builder();
            let columns = rg
                .take_columns()
                .into_iter()
                .map(|c| {
                    if is_float(&c) {
                        c.into_builder()
                            .clear_statistics()
                            .set_column_index_offset(None)
                            .set_column_index_length(None)
                            .build()
                    } else {
                        Ok(c)
                    }
                })
                .collect::<parquet::errors::Result<Vec<_>>>()?;
            rg.set_column_metadata(columns).build()
        })
        .collect::<parquet::errors::Result<Vec<_>>>()?;
    Ok(builder.set_row_groups(row_groups).build())
}

impl DecryptingReader {
    pub(crate) async fn build_view(&mut self) -> Result<View, parquet::errors::ParquetError> {
        let size = self.size;
        if size < 12 {
            return Err(self.dec.malformed("file is too short to be Parquet").into());
        }
        let prefetch = TAIL_PREFETCH.max(self.hint.unwrap_or(0) as u64).min(size);
        let tail = self.fetch(size - prefetch..size).await?;
        let n = tail.len();
        if n < 12 {
            return Err(self
                .dec
                .malformed("file is shorter than its listed size")
                .into());
        }
        let footer_len = u64::from(u32::from_le_bytes(
            tail[n - 8..n - 4].try_into().expect("4 bytes"),
        ));
        let magic: [u8; 4] = tail[n - 4..].try_into().expect("4 bytes");
        if footer_len + 8 > size {
            return Err(self
                .dec
                .malformed(format!(
                    "footer length {footer_len} exceeds the file size {size} (truncated file?)"
                ))
                .into());
        }
        self.footer_start = size - 8 - footer_len;
        let footer = if footer_len + 8 <= prefetch {
            tail.slice(n - 8 - footer_len as usize..n - 8)
        } else {
            self.fetch(size - 8 - footer_len..size - 8).await?
        };
        let view = match &magic {
            b"PAR1" => self.plaintext_footer(footer).await,
            b"PARE" => self.encrypted_footer(footer).await.map_err(Into::into),
            _ => Err(self
                .dec
                .malformed("not a Parquet file (no PAR1/PARE magic at the end)")
                .into()),
        }?;
        Ok(View {
            metadata: Arc::new(without_float_bounds(Arc::unwrap_or_clone(view.metadata))?),
            ..view
        })
    }

    async fn plaintext_footer(&mut self, footer: Bytes) -> parquet::errors::Result<View> {
        let mut rest = &footer[..];
        let meta: FileMetaData = compact::read(&mut rest)
            .map_err(|e| self.dec.malformed(format!("footer does not parse: {e}")))?;
        let Some(algorithm) = meta.encryption_algorithm.clone() else {
            if self
                .dec
                .keys
                .given
                .as_ref()
                .is_some_and(|g| g.require_encryption)
            {
                return Err(self
                    .dec.malformed(
                        "not encrypted, though its table gives it a key (a plaintext file in its place?)",
                    )
                    .into());
            }
            return Ok(View {
                metadata: Arc::new(ParquetMetaDataReader::decode_metadata(&footer)?),
                column_keys: Vec::new(),
                crypto: None,
            });
        };
        if rest.len() != NONCE_LEN + TAG_LEN {
            return Err(self
                .dec
                .malformed("plaintext footer is not followed by a 28-byte signature")
                .into());
        }
        let (algorithm, file_aad) = self.algorithm(&algorithm)?;
        let signed = footer.slice(..footer.len() - NONCE_LEN - TAG_LEN);
        let signature = &footer[signed.len()..];
        // The footer key signs the footer; without it (not granted to this scan) the
        // plaintext columns stay readable, unverified, as in every PME reader.
        let given = self
            .dec
            .keys
            .given
            .as_ref()
            .and_then(|g| g.footer.as_ref().map(|k| (g, k)));
        let footer_key = match (given, &meta.footer_signing_key_metadata) {
            (Some((g, k)), m) => g.cipher(k, m.as_deref().unwrap_or_default()).ok(),
            (None, Some(m)) => self.dec.key(m, true).await.ok(),
            (None, None) => None,
        };
        let verify = self
            .dec
            .keys
            .given
            .as_ref()
            .is_none_or(|g| g.verify_signature);
        if let Some(key) = footer_key.as_ref().filter(|_| verify) {
            self.verify_signature(key, algorithm, &file_aad, signed, signature)
                .await?;
        }
        self.rewrite(meta, algorithm, file_aad, footer_key)
            .await
            .map_err(Into::into)
    }

    async fn verify_signature(
        &self,
        key: &ColumnKey,
        algorithm: Algorithm,
        file_aad: &[u8],
        signed: Bytes,
        signature: &[u8],
    ) -> Result<()> {
        let position = ModulePosition::footer();
        let aad = position.aad(file_aad).expect("footer AAD");
        let nonce: [u8; NONCE_LEN] = signature[..NONCE_LEN].try_into().expect("12 bytes");
        let body = match &key.cipher {
            Some(c) => c
                .encrypt(
                    Algorithm::AesGcmV1,
                    ModuleType::Footer,
                    &aad,
                    &nonce,
                    &signed,
                )
                .map_err(|error| DecryptError::Tampered {
                    file: self.dec.file.clone(),
                    column: None,
                    position,
                    error,
                })?,
            None => {
                let batch = ModuleBatch {
                    key: key.key.clone(),
                    algorithm,
                    column: None,
                    modules: vec![Module {
                        position,
                        aad,
                        data: signed,
                        nonce: Some(nonce),
                    }],
                };
                self.dec.counters.provider_calls.add(1);
                let mut out = self
                    .dec
                    .keys
                    .provider
                    .encrypt(&self.dec.ctx(), batch)
                    .await
                    .map_err(|e| DecryptError::from_provider(&self.dec.file, None, e))?;
                out.pop().unwrap_or_default()
            }
        };
        let tag = body
            .get(body.len().saturating_sub(TAG_LEN)..)
            .unwrap_or(&[]);
        let expected = &signature[NONCE_LEN..];
        let same = tag.len() == TAG_LEN
            && tag
                .iter()
                .zip(expected)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if !same {
            return Err(DecryptError::Signature {
                file: self.dec.file.clone(),
            });
        }
        Ok(())
    }

    async fn encrypted_footer(&mut self, footer: Bytes) -> Result<View> {
        let mut rest = &footer[..];
        let crypto: FileCryptoMetaData = compact::read(&mut rest).map_err(|e| {
            self.dec
                .malformed(format!("FileCryptoMetaData does not parse: {e}"))
        })?;
        let consumed = footer.len() - rest.len();
        let (algorithm, file_aad) = self.algorithm(&crypto.encryption_algorithm)?;
        let given = self
            .dec
            .keys
            .given
            .as_ref()
            .and_then(|g| g.footer.as_ref().map(|k| (g, k)));
        let key = match given {
            Some((g, k)) => g.cipher(k, crypto.key_metadata.as_deref().unwrap_or_default()),
            None => {
                let metadata = crypto.key_metadata.as_deref().ok_or_else(|| {
                    self.dec
                        .malformed("encrypted footer without footer key metadata (no key given)")
                })?;
                self.dec.key(metadata, true).await
            }
        }
        .map_err(|e| DecryptError::from_provider(&self.dec.file, None, e))?;
        let (body, _) = split_module(&footer[consumed..]).ok_or(DecryptError::Tampered {
            file: self.dec.file.clone(),
            column: None,
            position: ModulePosition::footer(),
            error: ModuleError::Truncated,
        })?;
        let body = footer.slice_ref(body);
        let module = self.dec.module(&file_aad, ModulePosition::footer(), body)?;
        let plain = self
            .dec
            .decrypt(&key, algorithm, None, vec![module])
            .await?
            .pop()
            .unwrap_or_default();
        let meta: FileMetaData = compact::read(&mut &plain[..]).map_err(|e| {
            self.dec
                .malformed(format!("decrypted footer does not parse: {e}"))
        })?;
        self.rewrite(meta, algorithm, file_aad, Some(key)).await
    }

    /// The algorithm and the file AAD (`prefix || unique`).
    fn algorithm(&self, a: &EncryptionAlgorithm) -> Result<(Algorithm, Vec<u8>)> {
        let (algorithm, prefix, unique, supply) = match a {
            EncryptionAlgorithm::AESGCMV1(v) => (
                Algorithm::AesGcmV1,
                &v.aad_prefix,
                &v.aad_file_unique,
                v.supply_aad_prefix,
            ),
            EncryptionAlgorithm::AESGCMCTRV1(v) => (
                Algorithm::AesGcmCtrV1,
                &v.aad_prefix,
                &v.aad_file_unique,
                v.supply_aad_prefix,
            ),
        };
        let prefix = match (&self.dec.keys.grant.aad_prefix, prefix) {
            (Some(p), _) => p.clone(),
            (None, Some(p)) => p.clone(),
            (None, None) if supply == Some(true) => {
                return Err(DecryptError::AadPrefixRequired {
                    file: self.dec.file.clone(),
                });
            }
            (None, None) => Vec::new(),
        };
        let mut file_aad = prefix;
        file_aad.extend_from_slice(unique.as_deref().unwrap_or_default());
        Ok((algorithm, file_aad))
    }

    /// Turns decrypted file metadata into the plaintext view.
    async fn rewrite(
        &mut self,
        mut meta: FileMetaData,
        algorithm: Algorithm,
        file_aad: Vec<u8>,
        footer_key: Option<Arc<ColumnKey>>,
    ) -> Result<View> {
        let leaves = leaf_types(&meta.schema);
        // Which column each leaf belongs to: a key is bound to the column the policy
        // declares it for (`KeyScope::Columns`), not to any column that names it.
        let tops = top_level_fields(&meta.schema);
        // Keys by key metadata, each described and granted (or refused) once.
        let mut keys: HashMap<Vec<u8>, std::result::Result<Arc<ColumnKey>, String>> =
            HashMap::new();
        let mut key_ids: HashMap<Vec<u8>, String> = HashMap::new();
        // Column metadata modules to decrypt, per key.
        // (one call per key: grouped by the granted key's identity)
        let mut pending: BTreeMap<usize, Vec<(usize, usize, Bytes)>> = BTreeMap::new();
        let mut refused: HashMap<(usize, usize), String> = HashMap::new();
        let mut key_of: HashMap<(usize, usize), Arc<ColumnKey>> = HashMap::new();
        for (rg, group) in meta.row_groups.iter().enumerate() {
            for (col, chunk) in group.columns.iter().enumerate() {
                let metadata = match &chunk.crypto_metadata {
                    None => continue,
                    Some(ColumnCryptoMetaData::ENCRYPTIONWITHFOOTERKEY(_)) => None,
                    Some(ColumnCryptoMetaData::ENCRYPTIONWITHCOLUMNKEY(k)) => {
                        Some(k.key_metadata.clone().unwrap_or_default())
                    }
                };
                let given = self.dec.keys.given.as_ref().and_then(|g| {
                    let path = column_path(chunk);
                    let top = path.split('.').next().unwrap_or_default().to_owned();
                    g.columns
                        .get(&path)
                        .or_else(|| g.columns.get(&top))
                        .map(|k| (g, k))
                });
                // Keys from the file's own key metadata are bound to their column below.
                let bound = if given.is_none() {
                    metadata.clone()
                } else {
                    None
                };
                let key = match (given, metadata) {
                    (Some((g, k)), m) => g
                        .cipher(k, m.as_deref().unwrap_or_default())
                        .map_err(|e| e.to_string()),
                    (None, None) => footer_key
                        .clone()
                        .ok_or_else(|| "the footer key was not granted to this scan".to_owned()),
                    (None, Some(m)) => match keys.get(&m) {
                        Some(k) => k.clone(),
                        None => {
                            let k = match self.dec.describe(&m).await {
                                Ok(described) => {
                                    let id = described.master_key.then(|| described.key_id.clone());
                                    key_ids.insert(
                                        m.clone(),
                                        id.unwrap_or_else(|| EXPLICIT_KEY.into()),
                                    );
                                    self.dec
                                        .grant(described, false)
                                        .await
                                        .map_err(|e| e.to_string())
                                }
                                Err(e) => Err(e.to_string()),
                            };
                            keys.insert(m.clone(), k.clone());
                            k
                        }
                    },
                };
                let key = match (key, bound) {
                    (Ok(k), Some(m)) => match key_ids.get(&m).filter(|id| *id != EXPLICIT_KEY) {
                        Some(id) => {
                            let (field_id, name) =
                                tops.get(col).map_or((None, "?"), |(f, n)| (*f, n.as_str()));
                            self.dec
                                .keys
                                .grant
                                .scope
                                .check_column(field_id, name, id)
                                .map(|()| k)
                                .map_err(|e| e.to_string())
                        }
                        None => Ok(k),
                    },
                    (key, _) => key,
                };
                match key {
                    Ok(k) => {
                        if let Some(enc) = &chunk.encrypted_column_metadata {
                            pending.entry(Arc::as_ptr(&k) as usize).or_default().push((
                                rg,
                                col,
                                Bytes::copy_from_slice(enc),
                            ));
                        }
                        key_of.insert((rg, col), k);
                    }
                    Err(reason) => {
                        refused.insert((rg, col), reason);
                    }
                }
            }
        }
        // Decrypt column metadata: one call per key.
        let mut decrypted: HashMap<(usize, usize), ColumnMetaData> = HashMap::new();
        for (_, items) in pending {
            let key = Arc::clone(&key_of[&(items[0].0, items[0].1)]);
            let column = column_path(&meta.row_groups[items[0].0].columns[items[0].1]);
            let modules = items
                .iter()
                .map(|(rg, col, enc)| {
                    let body = split_module(enc).map(|(b, _)| enc.slice_ref(b)).ok_or(
                        DecryptError::Tampered {
                            file: self.dec.file.clone(),
                            column: Some(column.clone()),
                            position: ModulePosition::new(ModuleType::ColumnMetaData, *rg, *col, 0),
                            error: ModuleError::Truncated,
                        },
                    )?;
                    self.dec.module(
                        &file_aad,
                        ModulePosition::new(ModuleType::ColumnMetaData, *rg, *col, 0),
                        body,
                    )
                })
                .collect::<Result<Vec<_>>>()?;
            let plains = self
                .dec
                .decrypt(&key, algorithm, Some(&column), modules)
                .await?;
            for ((rg, col, _), plain) in items.iter().zip(plains) {
                let cmd: ColumnMetaData = compact::read(&mut &plain[..]).map_err(|e| {
                    self.dec.malformed(format!(
                        "column '{column}': decrypted column metadata does not parse: {e}"
                    ))
                })?;
                decrypted.insert((*rg, *col), cmd);
            }
        }

        let column_keys = meta
            .row_groups
            .first()
            .map(|g| {
                g.columns
                    .iter()
                    .map(|c| {
                        let id = match &c.crypto_metadata {
                            Some(ColumnCryptoMetaData::ENCRYPTIONWITHCOLUMNKEY(k)) => key_ids
                                .get(k.key_metadata.as_deref().unwrap_or_default())
                                .cloned(),
                            _ => None,
                        };
                        (column_path(c), id)
                    })
                    .collect()
            })
            .unwrap_or_default();
        let gaps = refused_extents(&meta, &decrypted, self.footer_start);
        let mut regions = Vec::new();
        for (rg, group) in meta.row_groups.iter_mut().enumerate() {
            for (col, chunk) in group.columns.iter_mut().enumerate() {
                if chunk.crypto_metadata.is_none() {
                    continue;
                }
                let path = column_path(chunk);
                if let Some(cmd) = decrypted.remove(&(rg, col)) {
                    chunk.meta_data = Some(cmd);
                }
                chunk.crypto_metadata = None;
                chunk.encrypted_column_metadata = None;
                match (key_of.get(&(rg, col)), refused.remove(&(rg, col))) {
                    (Some(key), _) => {
                        let Some(cmd) = chunk.meta_data.as_mut() else {
                            return Err(self.dec.malformed(format!(
                                "column '{path}' (row group {rg}) has no column metadata"
                            )));
                        };
                        let start = cmd
                            .dictionary_page_offset
                            .unwrap_or(cmd.data_page_offset)
                            .max(0) as u64;
                        let chunk_region = regions.len();
                        let mut offset_index = None;
                        regions.push(Region {
                            range: start..start + cmd.total_compressed_size.max(0) as u64,
                            column: path.clone(),
                            row_group: rg,
                            ordinal: col,
                            kind: RegionKind::Chunk {
                                key: Arc::clone(key),
                                has_dict: cmd.dictionary_page_offset.is_some(),
                                units: OnceLock::new(),
                                offset_index: None,
                            },
                        });
                        if let (Some(off), Some(len)) =
                            (chunk.offset_index_offset, chunk.offset_index_length)
                        {
                            offset_index = Some(regions.len());
                            regions.push(Region {
                                range: off as u64..(off + i64::from(len)) as u64,
                                column: path.clone(),
                                row_group: rg,
                                ordinal: col,
                                kind: RegionKind::OffsetIndex {
                                    key: Arc::clone(key),
                                    chunk: chunk_region,
                                },
                            });
                            chunk.offset_index_length = Some(len - GCM_OVERHEAD as i32);
                        }
                        if let RegionKind::Chunk {
                            offset_index: o, ..
                        } = &mut regions[chunk_region].kind
                        {
                            *o = offset_index;
                        }
                        if let (Some(off), Some(len)) =
                            (chunk.column_index_offset, chunk.column_index_length)
                        {
                            regions.push(Region {
                                range: off as u64..(off + i64::from(len)) as u64,
                                column: path.clone(),
                                row_group: rg,
                                ordinal: col,
                                kind: RegionKind::ColumnIndex {
                                    key: Arc::clone(key),
                                },
                            });
                            chunk.column_index_length = Some(len - GCM_OVERHEAD as i32);
                        }
                        if let Some(off) = cmd.bloom_filter_offset {
                            match cmd.bloom_filter_length {
                                Some(len) if len > 2 * GCM_OVERHEAD as i32 => {
                                    regions.push(Region {
                                        range: off as u64..(off + i64::from(len)) as u64,
                                        column: path.clone(),
                                        row_group: rg,
                                        ordinal: col,
                                        kind: RegionKind::Bloom {
                                            key: Arc::clone(key),
                                        },
                                    });
                                    cmd.bloom_filter_length = Some(len - 2 * GCM_OVERHEAD as i32);
                                }
                                // Without its length the filter's extent is unknown: not used.
                                _ => {
                                    cmd.bloom_filter_offset = None;
                                    cmd.bloom_filter_length = None;
                                }
                            }
                        }
                    }
                    (None, reason) => {
                        let reason =
                            reason.unwrap_or_else(|| "its key was not resolved".to_owned());
                        let cmd = chunk.meta_data.get_or_insert_with(|| {
                            let (start, len) = gaps.get(&(rg, col)).copied().unwrap_or((4, 0));
                            placeholder(&leaves, col, &path, group.num_rows, start, len)
                        });
                        cmd.statistics = None;
                        cmd.bloom_filter_offset = None;
                        cmd.bloom_filter_length = None;
                        cmd.size_statistics = None;
                        let start = cmd
                            .dictionary_page_offset
                            .unwrap_or(cmd.data_page_offset)
                            .max(0) as u64;
                        let len = cmd.total_compressed_size.max(0) as u64;
                        if len > 0 {
                            regions.push(Region {
                                range: start..start + len,
                                column: path.clone(),
                                row_group: rg,
                                ordinal: col,
                                kind: RegionKind::Refused(reason.clone()),
                            });
                        }
                        chunk.column_index_offset = None;
                        chunk.column_index_length = None;
                        match (chunk.offset_index_offset, chunk.offset_index_length) {
                            (Some(off), Some(enc_len)) => {
                                let stand_in =
                                    compact::single_page_offset_index(start as i64, len as i64);
                                if stand_in.len() <= enc_len.max(0) as usize {
                                    chunk.offset_index_length = Some(stand_in.len() as i32);
                                    regions.push(Region {
                                        range: off as u64..(off + i64::from(enc_len)) as u64,
                                        column: path.clone(),
                                        row_group: rg,
                                        ordinal: col,
                                        kind: RegionKind::Synthetic(stand_in.into()),
                                    });
                                } else {
                                    chunk.offset_index_offset = None;
                                    chunk.offset_index_length = None;
                                }
                            }
                            _ => {
                                chunk.offset_index_offset = None;
                                chunk.offset_index_length = None;
                            }
                        }
                    }
                }
            }
        }
        meta.encryption_algorithm = None;
        meta.footer_signing_key_metadata = None;
        regions.sort_by_key(|r| r.range.start);
        // Re-point chunk -> offset index links after sorting.
        relink(&mut regions);
        for w in regions.windows(2) {
            if w[0].range.end > w[1].range.start {
                return Err(self.dec.malformed(format!(
                    "column '{}' (row group {}) overlaps column '{}' (row group {})",
                    w[0].column, w[0].row_group, w[1].column, w[1].row_group
                )));
            }
        }
        let bytes = compact::write(&meta);
        let metadata = ParquetMetaDataReader::decode_metadata(&bytes).map_err(|e| {
            self.dec
                .malformed(format!("decrypted metadata is not valid Parquet: {e}"))
        })?;
        Ok(View {
            metadata: Arc::new(metadata),
            column_keys,
            crypto: Some(FileCrypto {
                algorithm,
                file_aad,
                regions,
            }),
        })
    }
}

/// Where the chunks of columns whose metadata stays encrypted (encrypted footer, column
/// key not granted) are: between their neighbours, as chunks are laid out in column
/// order. Their placeholders cover these bytes, so that reading them fails (a chunk of
/// zero bytes would read as zero rows).
fn refused_extents(
    meta: &FileMetaData,
    decrypted: &HashMap<(usize, usize), ColumnMetaData>,
    footer_start: u64,
) -> HashMap<(usize, usize), (u64, u64)> {
    let extent = |rg: usize, col: usize| {
        let chunk = &meta.row_groups[rg].columns[col];
        let cmd = decrypted.get(&(rg, col)).or(chunk.meta_data.as_ref())?;
        let start = cmd
            .dictionary_page_offset
            .unwrap_or(cmd.data_page_offset)
            .max(0) as u64;
        Some((start, start + cmd.total_compressed_size.max(0) as u64))
    };
    // Everything else that has a place: known chunks, indexes, Bloom filters, the footer.
    let mut occupied = vec![footer_start];
    for (rg, group) in meta.row_groups.iter().enumerate() {
        for (col, chunk) in group.columns.iter().enumerate() {
            occupied.extend(extent(rg, col).map(|e| e.0));
            occupied.extend(chunk.column_index_offset.map(|o| o.max(0) as u64));
            occupied.extend(chunk.offset_index_offset.map(|o| o.max(0) as u64));
        }
    }
    occupied.sort_unstable();
    let mut out = HashMap::new();
    let mut cursor = 4u64;
    for (rg, group) in meta.row_groups.iter().enumerate() {
        let n = group.columns.len();
        let mut col = 0;
        while col < n {
            if let Some((_, end)) = extent(rg, col) {
                cursor = end;
                col += 1;
                continue;
            }
            let run_end = (col..n).find(|c| extent(rg, *c).is_some()).unwrap_or(n);
            let end = match extent(rg, run_end.min(n.saturating_sub(1))) {
                Some((start, _)) if run_end < n => start,
                _ => occupied
                    .iter()
                    .copied()
                    .find(|o| *o > cursor)
                    .unwrap_or(footer_start),
            };
            let count = (run_end - col) as u64;
            let share = end.saturating_sub(cursor) / count.max(1);
            for (i, c) in (col..run_end).enumerate() {
                out.insert((rg, c), (cursor + i as u64 * share, share));
            }
            cursor = end;
            col = run_end;
        }
    }
    out
}

/// Column metadata for a refused column whose metadata stays encrypted: enough for
/// parquet-rs to build the schema; its data is never read.
fn placeholder(
    leaves: &[parquet::format::Type],
    col: usize,
    path: &str,
    num_rows: i64,
    offset: u64,
    len: u64,
) -> ColumnMetaData {
    ColumnMetaData {
        type_: leaves
            .get(col)
            .copied()
            .unwrap_or(parquet::format::Type::BYTE_ARRAY),
        encodings: vec![],
        path_in_schema: path.split('.').map(Into::into).collect(),
        codec: CompressionCodec::UNCOMPRESSED,
        num_values: num_rows,
        total_uncompressed_size: len as i64,
        total_compressed_size: len as i64,
        key_value_metadata: None,
        data_page_offset: offset as i64,
        index_page_offset: None,
        dictionary_page_offset: None,
        statistics: None,
        encoding_stats: None,
        bloom_filter_offset: None,
        bloom_filter_length: None,
        size_statistics: None,
        geospatial_statistics: None,
    }
}
