//! Pages: the encrypted regions of a file ([`Region`]: column chunks, indexes, Bloom
//! filters, placeholders) and their plaintext, down to single pages of a chunk ([`Unit`])
//! decrypted alone for page index reads.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, OnceLock};

use bytes::{Bytes, BytesMut};
use clearice_crypto::modules::{GCM_OVERHEAD, LENGTH_LEN, split_module};
use clearice_crypto::{Algorithm, Module, ModuleError, ModulePosition, ModuleType};

use crate::keys::{ColumnKey, FileDecryptor};
use crate::reader::DecryptingReader;
use crate::{DecryptError, Result, compact, error};

pub(crate) struct FileCrypto {
    pub(crate) algorithm: Algorithm,
    pub(crate) file_aad: Vec<u8>,
    /// Sorted by start, not overlapping.
    pub(crate) regions: Vec<Region>,
}

pub(crate) struct Region {
    pub(crate) range: Range<u64>,
    pub(crate) column: String,
    pub(crate) row_group: usize,
    pub(crate) ordinal: usize,
    pub(crate) kind: RegionKind,
}

pub(crate) enum RegionKind {
    Chunk {
        key: Arc<ColumnKey>,
        has_dict: bool,
        /// Pages with plaintext offsets, from the offset index once decrypted.
        units: OnceLock<Arc<Vec<Unit>>>,
        offset_index: Option<usize>,
    },
    ColumnIndex {
        key: Arc<ColumnKey>,
    },
    OffsetIndex {
        key: Arc<ColumnKey>,
        chunk: usize,
    },
    Bloom {
        key: Arc<ColumnKey>,
    },
    /// A stand-in offset index of a refused column.
    Synthetic(Bytes),
    Refused(String),
}

/// One page (header and body modules) of a column chunk.
#[derive(Debug, Clone)]
pub(crate) struct Unit {
    enc: Range<u64>,
    plain: Range<u64>,
    dict: bool,
    ordinal: usize,
}

impl DecryptingReader {
    /// The plaintext of `sub` (inside region `i`).
    pub(crate) async fn image(
        &mut self,
        crypto: &FileCrypto,
        i: usize,
        sub: Range<u64>,
    ) -> parquet::errors::Result<Bytes> {
        let region = &crypto.regions[i];
        let rel =
            (sub.start - region.range.start) as usize..(sub.end - region.range.start) as usize;
        let whole = match &region.kind {
            RegionKind::Refused(reason) => {
                return Err(DecryptError::Refused {
                    file: self.dec.file.clone(),
                    column: region.column.clone(),
                    reason: reason.clone(),
                }
                .into());
            }
            RegionKind::Chunk { .. } => return self.chunk_image(crypto, i, sub).await,
            _ => self.small_region(crypto, i).await?,
        };
        let mut b = BytesMut::zeroed(rel.len());
        let have = whole.len().min(rel.end).saturating_sub(rel.start);
        if have > 0 {
            b[..have].copy_from_slice(&whole[rel.start..rel.start + have]);
        }
        Ok(b.freeze())
    }

    /// Plaintext of an index, Bloom filter or stand-in region (without trailing zeros).
    async fn small_region(&mut self, crypto: &FileCrypto, i: usize) -> Result<Bytes> {
        if let Some(b) = self.small.get(&i) {
            return Ok(b.clone());
        }
        let enc = self.small_enc(crypto, i).await?;
        let plain = self.dec.small_plaintext(crypto, i, enc).await?;
        self.small.insert(i, plain.clone());
        Ok(plain)
    }

    /// Decrypts the small regions among `hits` not decrypted yet, concurrently: a read of
    /// a row group's page indexes (one range) asks a remote provider once per index, in
    /// parallel rather than one after another.
    pub(crate) async fn small_regions(
        &mut self,
        crypto: &FileCrypto,
        hits: &[usize],
    ) -> Result<()> {
        let todo: Vec<usize> = hits
            .iter()
            .copied()
            .filter(|i| {
                !self.small.contains_key(i)
                    && !matches!(
                        crypto.regions[*i].kind,
                        RegionKind::Chunk { .. } | RegionKind::Refused(_)
                    )
            })
            .collect();
        if todo.len() < 2 {
            return Ok(());
        }
        let mut encs = Vec::with_capacity(todo.len());
        for i in &todo {
            encs.push(self.small_enc(crypto, *i).await?);
        }
        let decrypting = todo
            .iter()
            .zip(encs)
            .map(|(i, enc)| self.dec.small_plaintext(crypto, *i, enc));
        let plains = futures::future::try_join_all(decrypting).await?;
        self.small.extend(todo.into_iter().zip(plains));
        Ok(())
    }

    /// The encrypted bytes of small region `i` (none for a stand-in).
    async fn small_enc(&mut self, crypto: &FileCrypto, i: usize) -> Result<Bytes> {
        let region = &crypto.regions[i];
        match region.kind {
            RegionKind::Synthetic(_) => Ok(Bytes::new()),
            _ => self.fetch_region(region.range.clone()).await,
        }
    }

    async fn fetch_region(&mut self, range: Range<u64>) -> Result<Bytes> {
        let file = self.dec.file.clone();
        self.fetch(range)
            .await
            .map_err(|e| DecryptError::Malformed {
                file,
                reason: e.to_string(),
            })
    }

    /// Serves the requests among `ranges` not in `out` yet that are page ranges of one
    /// column chunk each (a row group's columns in a page index read), decrypting them
    /// concurrently: a remote provider answers them in parallel.
    pub(crate) async fn page_ranges(
        &mut self,
        crypto: &FileCrypto,
        ranges: &[Range<u64>],
        out: &mut [Option<Bytes>],
    ) -> parquet::errors::Result<()> {
        let jobs: Vec<(usize, usize, usize, Range<u64>)> = ranges
            .iter()
            .enumerate()
            .filter(|(idx, _)| out[*idx].is_none())
            .filter_map(|(idx, r)| {
                let (at, first, last) = page_range(&crypto.regions, r)?;
                let RegionKind::Chunk { units, .. } = &crypto.regions[at].kind else {
                    return None;
                };
                Some((idx, at, first, u_enc(units.get()?, first, last)))
            })
            .collect();
        if jobs.len() < 2 {
            return Ok(());
        }
        let mut encs = Vec::with_capacity(jobs.len());
        for (_, _, _, enc) in &jobs {
            encs.push(self.fetch_owned(enc.clone()).await?);
        }
        let decrypting = jobs.iter().zip(encs).map(|((idx, at, first, _), enc)| {
            self.dec
                .decrypt_page_range(crypto, *at, *first, &ranges[*idx], enc)
        });
        let plains = futures::future::try_join_all(decrypting).await?;
        for ((idx, ..), plain) in jobs.iter().zip(plains) {
            out[*idx] = Some(plain);
        }
        Ok(())
    }

    /// The plaintext of `sub` inside column chunk region `i`.
    async fn chunk_image(
        &mut self,
        crypto: &FileCrypto,
        i: usize,
        sub: Range<u64>,
    ) -> parquet::errors::Result<Bytes> {
        let region = &crypto.regions[i];
        let RegionKind::Chunk {
            units,
            offset_index,
            ..
        } = &region.kind
        else {
            unreachable!("chunk region")
        };
        let whole = sub == region.range;
        if !whole
            && units.get().is_none()
            && let Some(oi) = offset_index
        {
            self.small_region(crypto, *oi).await?;
        }
        // A page range (page index reads): decrypt only those pages.
        if !whole
            && let Some((_, first, last)) = page_range(&crypto.regions, &sub)
            && let Some(units) = units.get()
        {
            let enc = self.fetch_owned(u_enc(units, first, last)).await?;
            return self
                .dec
                .decrypt_page_range(crypto, i, first, &sub, enc)
                .await;
        }
        let enc = self.fetch_owned(region.range.clone()).await?;
        let plain = self.dec.decrypt_chunk(crypto, i, enc).await?;
        let rel =
            (sub.start - region.range.start) as usize..(sub.end - region.range.start) as usize;
        Ok(plain.slice(rel))
    }
}

impl FileDecryptor {
    /// Plaintext of an index, Bloom filter or stand-in region `i` from its encrypted
    /// bytes (without trailing zeros).
    pub(crate) async fn small_plaintext(
        &self,
        crypto: &FileCrypto,
        i: usize,
        enc: Bytes,
    ) -> Result<Bytes> {
        let region = &crypto.regions[i];
        let (rg, col, column) = (region.row_group, region.ordinal, region.column.as_str());
        Ok(match &region.kind {
            RegionKind::Synthetic(b) => b.clone(),
            RegionKind::ColumnIndex { key } => {
                let m = self.one_module(crypto, &enc, ModuleType::ColumnIndex, rg, col, column)?;
                self.decrypt(key, crypto.algorithm, Some(column), vec![m])
                    .await?
                    .remove(0)
            }
            RegionKind::OffsetIndex { key, chunk } => {
                let m = self.one_module(crypto, &enc, ModuleType::OffsetIndex, rg, col, column)?;
                let mut plain = Vec::from(
                    self.decrypt(key, crypto.algorithm, Some(column), vec![m])
                        .await?
                        .remove(0),
                );
                self.plaintext_offsets(crypto, *chunk, &mut plain)?;
                Bytes::from(plain)
            }
            RegionKind::Bloom { key } => {
                let bad = |error| DecryptError::Tampered {
                    file: self.file.clone(),
                    column: Some(column.into()),
                    position: ModulePosition::new(ModuleType::BloomFilterHeader, rg, col, 0),
                    error,
                };
                let (header, rest) =
                    split_module(&enc).ok_or_else(|| bad(ModuleError::Truncated))?;
                let (bitset, _) = split_module(rest).ok_or_else(|| bad(ModuleError::Truncated))?;
                let modules = vec![
                    self.module(
                        &crypto.file_aad,
                        ModulePosition::new(ModuleType::BloomFilterHeader, rg, col, 0),
                        enc.slice_ref(header),
                    )?,
                    self.module(
                        &crypto.file_aad,
                        ModulePosition::new(ModuleType::BloomFilterBitset, rg, col, 0),
                        enc.slice_ref(bitset),
                    )?,
                ];
                let parts = self
                    .decrypt(key, crypto.algorithm, Some(column), modules)
                    .await?;
                let mut parts: Vec<Vec<u8>> = parts.into_iter().map(Vec::from).collect();
                // Readers take the bitset to follow the header struct and to run to the
                // end of `bloom_filter_length`: the header keeps its module's length.
                compact::rewrite_bloom_header(&mut parts[0]).ok_or_else(|| {
                    self.malformed(format!(
                        "column '{column}': bloom filter header does not parse"
                    ))
                })?;
                Bytes::from(parts.concat())
            }
            RegionKind::Chunk { .. } | RegionKind::Refused(_) => unreachable!("not small"),
        })
    }

    fn one_module(
        &self,
        crypto: &FileCrypto,
        enc: &Bytes,
        kind: ModuleType,
        rg: usize,
        col: usize,
        column: &str,
    ) -> Result<Module> {
        let position = ModulePosition::new(kind, rg, col, 0);
        let (body, _) = split_module(enc).ok_or(DecryptError::Tampered {
            file: self.file.clone(),
            column: Some(column.into()),
            position,
            error: ModuleError::Truncated,
        })?;
        self.module(&crypto.file_aad, position, enc.slice_ref(body))
    }

    /// Rewrites a decrypted offset index to plaintext page offsets and records the
    /// chunk's pages.
    fn plaintext_offsets(&self, crypto: &FileCrypto, chunk: usize, index: &mut [u8]) -> Result<()> {
        let region = &crypto.regions[chunk];
        let RegionKind::Chunk {
            units, has_dict, ..
        } = &region.kind
        else {
            unreachable!("offset index of a chunk")
        };
        let bad = |reason: &str| {
            self.malformed(format!(
                "column '{}' (row group {}): offset index {reason}",
                region.column, region.row_group
            ))
        };
        let locations =
            compact::offset_index_locations(index).ok_or_else(|| bad("does not parse"))?;
        let algorithm = crypto.algorithm;
        let mut list = Vec::with_capacity(locations.len() + 1);
        let (start, end) = (region.range.start, region.range.end);
        let mut enc_at = start;
        let mut plain_at = start;
        let mut push = |enc: Range<u64>, dict: bool, ordinal: usize| -> Result<()> {
            let kind = if dict {
                ModuleType::DictionaryPage
            } else {
                ModuleType::DataPage
            };
            let overhead = (GCM_OVERHEAD + algorithm.overhead(kind)) as u64;
            let len = (enc.end - enc.start)
                .checked_sub(overhead)
                .ok_or_else(|| bad("has a page smaller than its encryption overhead"))?;
            list.push(Unit {
                enc,
                plain: plain_at..plain_at + len,
                dict,
                ordinal,
            });
            plain_at += len;
            Ok(())
        };
        if let Some(first) = locations.first()
            && (first.offset as u64) > start
        {
            if !has_dict {
                return Err(bad("leaves a gap before the first page"));
            }
            push(start..first.offset as u64, true, 0)?;
            enc_at = first.offset as u64;
        }
        for (ordinal, loc) in locations.iter().enumerate() {
            let (off, size) = (loc.offset as u64, loc.size.max(0) as u64);
            if off != enc_at || off + size > end {
                return Err(bad("does not match the column chunk"));
            }
            push(off..off + size, false, ordinal)?;
            enc_at = off + size;
        }
        let pages: Vec<(i64, i64)> = list
            .iter()
            .filter(|u| !u.dict)
            .map(|u| (u.plain.start as i64, (u.plain.end - u.plain.start) as i64))
            .collect();
        compact::patch_offset_index(index, &locations, pages)
            .ok_or_else(|| bad("cannot be rewritten"))?;
        let _ = units.set(Arc::new(list));
        Ok(())
    }

    /// The plaintext of `sub`, a page range of column chunk region `at` whose pages
    /// start with page `first`, from the encrypted bytes of its pages (`enc`).
    pub(crate) async fn decrypt_page_range(
        &self,
        crypto: &FileCrypto,
        at: usize,
        first: usize,
        sub: &Range<u64>,
        enc: Bytes,
    ) -> parquet::errors::Result<Bytes> {
        let region = &crypto.regions[at];
        let RegionKind::Chunk { key, units, .. } = &region.kind else {
            unreachable!("chunk region")
        };
        let a = &units.get().expect("pages known")[first];
        self.counters.page_ranges.add(1);
        let plain = self
            .decrypt_pages(crypto, region, key, enc, a.dict, a.ordinal)
            .await?;
        let from = (sub.start - a.plain.start) as usize;
        let to = (sub.end - a.plain.start) as usize;
        if to > plain.len() {
            return Err(self
                .malformed(format!(
                    "column '{}' (row group {}): pages do not match the offset index",
                    region.column, region.row_group
                ))
                .into());
        }
        Ok(plain.freeze().slice(from..to))
    }

    /// The plaintext of column chunk region `at` from its encrypted bytes (`enc`, the
    /// whole region), at their length.
    pub(crate) async fn decrypt_chunk(
        &self,
        crypto: &FileCrypto,
        at: usize,
        enc: Bytes,
    ) -> parquet::errors::Result<Bytes> {
        let region = &crypto.regions[at];
        let RegionKind::Chunk { key, has_dict, .. } = &region.kind else {
            unreachable!("chunk region")
        };
        let enc_len = enc.len();
        let plain = self
            .decrypt_pages(crypto, region, key, enc, *has_dict, 0)
            .await?;
        self.counters.chunks.add(1);
        self.pad_chunk(region, enc_len, plain)
    }

    /// A decrypted chunk at its encrypted length: the slack becomes an `INDEX_PAGE`.
    pub(crate) fn pad_chunk(
        &self,
        region: &Region,
        enc_len: usize,
        mut plain: BytesMut,
    ) -> parquet::errors::Result<Bytes> {
        let slack = enc_len.checked_sub(plain.len()).ok_or_else(|| {
            self.malformed(format!(
                "column '{}' (row group {}): plaintext longer than its encrypted chunk",
                region.column, region.row_group
            ))
        })?;
        if slack > 0 {
            let pad = compact::index_page(slack).ok_or_else(|| {
                self.malformed(format!(
                    "column '{}' (row group {}): {slack} spare bytes cannot hold a page header",
                    region.column, region.row_group
                ))
            })?;
            plain.extend_from_slice(&pad);
        }
        Ok(plain.freeze())
    }

    /// Decrypts consecutive pages (header and body modules) starting with the page of
    /// ordinal `ordinal` (or the dictionary page), returning them in plaintext, packed.
    pub(crate) async fn decrypt_pages(
        &self,
        crypto: &FileCrypto,
        region: &Region,
        key: &ColumnKey,
        enc: Bytes,
        first_is_dict: bool,
        ordinal: usize,
    ) -> Result<BytesMut> {
        let (rg, col, column) = (region.row_group, region.ordinal, region.column.as_str());
        let truncated = |kind, page| DecryptError::Tampered {
            file: self.file.clone(),
            column: Some(column.into()),
            position: ModulePosition::new(kind, rg, col, page),
            error: ModuleError::Truncated,
        };
        // Module bodies (positions in `enc`), header and page alternating.
        let mut bodies: Vec<(ModulePosition, Range<usize>)> = Vec::new();
        let (mut at, mut dict, mut page) = (0usize, first_is_dict, ordinal);
        while at < enc.len() {
            let (hk, pk) = if dict {
                (ModuleType::DictionaryPageHeader, ModuleType::DictionaryPage)
            } else {
                (ModuleType::DataPageHeader, ModuleType::DataPage)
            };
            let (header, after) = split_module(&enc[at..]).ok_or_else(|| truncated(hk, page))?;
            let h = at + LENGTH_LEN..at + LENGTH_LEN + header.len();
            let (body, _) = split_module(after).ok_or_else(|| truncated(pk, page))?;
            let p = h.end + LENGTH_LEN..h.end + LENGTH_LEN + body.len();
            at = p.end;
            bodies.push((ModulePosition::new(hk, rg, col, page), h));
            bodies.push((ModulePosition::new(pk, rg, col, page), p));
            if !dict {
                page += 1;
            }
            dict = false;
        }
        let aad = |p: &ModulePosition| {
            p.aad(&crypto.file_aad)
                .ok_or_else(|| self.malformed("more than 32767 row groups, columns or pages"))
        };
        match &key.cipher {
            Some(cipher) => {
                // In place: each module decrypts into the buffer it was read into, packed
                // from the start (no copy when the fetched buffer is not shared).
                self.counters.modules.add(bodies.len());
                let mut buf = enc
                    .try_into_mut()
                    .unwrap_or_else(|shared| BytesMut::from(&shared[..]));
                let mut w = 0;
                for pair in bodies.chunks(2) {
                    let mut plain = [0usize; 2];
                    let header_at = w;
                    for (i, (position, range)) in pair.iter().enumerate() {
                        plain[i] = cipher
                            .decrypt_within(
                                crypto.algorithm,
                                position.kind,
                                &aad(position)?,
                                &mut buf,
                                range.clone(),
                                w,
                            )
                            .map_err(|error| DecryptError::Tampered {
                                file: self.file.clone(),
                                column: Some(column.into()),
                                position: *position,
                                error,
                            })?;
                        w += plain[i];
                    }
                    self.fix_header(
                        &mut buf[header_at..header_at + plain[0]],
                        &pair[0].0,
                        plain[1],
                        column,
                    )?;
                }
                buf.truncate(w);
                Ok(buf)
            }
            None => {
                let modules = bodies
                    .iter()
                    .map(|(position, range)| {
                        Ok(Module {
                            position: *position,
                            aad: aad(position)?,
                            data: enc.slice(range.clone()),
                            nonce: None,
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                let plains = self
                    .decrypt(key, crypto.algorithm, Some(column), modules)
                    .await?;
                let mut out = BytesMut::with_capacity(enc.len());
                // The view's layout follows from module lengths: a plaintext of another
                // length is an error, never a shifted page.
                for ((position, range), plain) in bodies.iter().zip(&plains) {
                    let overhead = crypto.algorithm.overhead(position.kind) - LENGTH_LEN;
                    if plain.len() + overhead != range.len() {
                        return Err(self.malformed(format!(
                            "column '{column}': {}: the crypto provider returned {} bytes for a {}-byte module",
                            error::module_desc(position),
                            plain.len(),
                            range.len()
                        )));
                    }
                }
                for (pair, plain) in bodies.chunks(2).zip(plains.chunks(2)) {
                    let mut header = plain[0].to_vec();
                    self.fix_header(&mut header, &pair[0].0, plain[1].len(), column)?;
                    out.extend_from_slice(&header);
                    out.extend_from_slice(&plain[1]);
                }
                Ok(out)
            }
        }
    }

    /// Gives a decrypted page header its plaintext body size (same header length).
    fn fix_header(
        &self,
        header: &mut [u8],
        p: &ModulePosition,
        body_len: usize,
        column: &str,
    ) -> Result<()> {
        let p = *p;
        let bad = |reason: String| {
            self.malformed(format!(
                "column '{column}': {}: {reason}",
                error::module_desc(&p)
            ))
        };
        let page_type = compact::rewrite_page_header(header, body_len as i64)
            .ok_or_else(|| bad("page header does not parse".into()))?;
        let is_dict = page_type == compact::DICTIONARY_PAGE;
        if is_dict != (p.kind == ModuleType::DictionaryPageHeader) {
            return Err(bad(format!("unexpected page type {page_type}")));
        }
        Ok(())
    }
}

/// The pages (first and last index) whose plaintext covers `sub`, when `sub` ends within
/// them (not in the chunk's trailing padding).
pub(crate) fn page_span(units: &[Unit], sub: &Range<u64>) -> Option<(usize, usize)> {
    let first = units.iter().position(|u| u.plain.end > sub.start)?;
    let last = units.iter().rposition(|u| u.plain.start < sub.end)?;
    (first <= last && sub.end <= units[last].plain.end).then_some((first, last))
}

/// The column chunk region a page range `range` lies in (not the whole chunk), with the
/// first and last of its pages, when the chunk's pages are known.
pub(crate) fn page_range(regions: &[Region], range: &Range<u64>) -> Option<(usize, usize, usize)> {
    let at = regions.partition_point(|g| g.range.end <= range.start);
    let region = regions.get(at)?;
    if region.range.start > range.start || range.end > region.range.end || region.range == *range {
        return None;
    }
    let RegionKind::Chunk { units, .. } = &region.kind else {
        return None;
    };
    let (first, last) = page_span(units.get()?, range)?;
    Some((at, first, last))
}

/// The encrypted bytes of pages `first..=last`.
pub(crate) fn u_enc(units: &[Unit], first: usize, last: usize) -> Range<u64> {
    units[first].enc.start..units[last].enc.end
}

/// The column chunk region `range` is exactly, if any.
pub(crate) fn whole_chunk(regions: &[Region], range: &Range<u64>) -> Option<usize> {
    let at = regions.partition_point(|g| g.range.start < range.start);
    let region = regions.get(at)?;
    (region.range == *range && matches!(region.kind, RegionKind::Chunk { .. })).then_some(at)
}

/// Bytes of `range` inside the regions `hits` (which overlap it).
pub(crate) fn covered(regions: &[Region], hits: &[usize], range: &Range<u64>) -> u64 {
    hits.iter()
        .map(|i| {
            let g = &regions[*i].range;
            g.end.min(range.end) - g.start.max(range.start)
        })
        .sum()
}

/// Indexes of the regions overlapping `range`.
pub(crate) fn overlapping(regions: &[Region], range: &Range<u64>) -> Vec<usize> {
    let from = regions.partition_point(|r| r.range.end <= range.start);
    (from..regions.len())
        .take_while(|i| regions[*i].range.start < range.end)
        .collect()
}

/// After sorting, chunk regions point at their offset index region (and back).
pub(crate) fn relink(regions: &mut [Region]) {
    let mut chunk_at: HashMap<(usize, usize), usize> = HashMap::new();
    for (i, r) in regions.iter().enumerate() {
        if matches!(r.kind, RegionKind::Chunk { .. }) {
            chunk_at.insert((r.row_group, r.ordinal), i);
        }
    }
    let mut oi_at: HashMap<(usize, usize), usize> = HashMap::new();
    for (i, r) in regions.iter_mut().enumerate() {
        if let RegionKind::OffsetIndex { chunk, .. } = &mut r.kind {
            *chunk = chunk_at[&(r.row_group, r.ordinal)];
            oi_at.insert((r.row_group, r.ordinal), i);
        }
    }
    for r in regions.iter_mut() {
        let at = oi_at.get(&(r.row_group, r.ordinal)).copied();
        if let RegionKind::Chunk { offset_index, .. } = &mut r.kind {
            *offset_index = at;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_finds_regions() {
        let mk = |a: u64, b: u64| Region {
            range: a..b,
            column: String::new(),
            row_group: 0,
            ordinal: 0,
            kind: RegionKind::Refused(String::new()),
        };
        let regions = vec![mk(10, 20), mk(20, 30), mk(40, 50)];
        assert_eq!(overlapping(&regions, &(0..10)), Vec::<usize>::new());
        assert_eq!(overlapping(&regions, &(15..25)), vec![0, 1]);
        assert_eq!(overlapping(&regions, &(30..40)), Vec::<usize>::new());
        assert_eq!(overlapping(&regions, &(0..100)), vec![0, 1, 2]);
    }
}
