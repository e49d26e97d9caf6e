//! The reader: [`DecryptingReader`], the [`AsyncFileReader`] DataFusion's scan reads one
//! file through, its scan metrics, and the serving of requested byte ranges from the
//! plaintext view.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use datafusion::common::runtime::SpawnedTask;
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder};
use futures::FutureExt;
use futures::future::BoxFuture;
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader};

use crate::DecryptError;
use crate::footer::View;
use crate::keys::{FileDecryptor, ScanKeys};
use crate::pages::{Region, RegionKind, covered, overlapping, page_span, u_enc, whole_chunk};
use crate::shared::Views;

/// An [`AsyncFileReader`] serving the plaintext view of one file.
pub struct DecryptingReader {
    /// In a mutex only to make the reader `Sync` (it is never locked: `get_mut`).
    inner: std::sync::Mutex<Box<dyn AsyncFileReader + Send>>,
    /// The file's name, keys and counters, as its modules are decrypted.
    pub(crate) dec: FileDecryptor,
    pub(crate) size: u64,
    pub(crate) hint: Option<usize>,
    view: Option<Arc<View>>,
    /// Where the footer starts (known once read).
    pub(crate) footer_start: u64,
    /// Plaintext of small regions (indexes, Bloom filters) by region index.
    pub(crate) small: HashMap<usize, Bytes>,
    /// Encrypted ranges fetched together for one `get_byte_ranges` call.
    prefetched: HashMap<Range<u64>, Bytes>,
    /// Column chunks being decrypted ahead of the reader, by region (at most one row
    /// group's, the next one; see [`Self::plan_ahead`]).
    ahead: HashMap<usize, SpawnedTask<parquet::errors::Result<Bytes>>>,
    /// The row group of the last request for whole column chunks.
    last_row_group: Option<usize>,
    /// Views shared with the scan's other readers.
    views: Option<Arc<Views>>,
}

/// What the reader did, in the scan's metrics (`EXPLAIN ANALYZE`).
#[derive(Clone)]
pub(crate) struct Counters {
    /// Calls to the crypto provider (describe, release, decrypt, encrypt).
    pub(crate) provider_calls: Count,
    /// Modules decrypted (in process with a released key, or by the provider).
    pub(crate) modules: Count,
    /// Column chunks decrypted whole.
    pub(crate) chunks: Count,
    /// Page ranges decrypted alone (page index reads).
    pub(crate) page_ranges: Count,
    /// Column chunks sent to the provider ahead of the reader (the next row group's).
    pub(crate) ahead: Count,
}

impl Counters {
    pub(crate) fn new(metrics: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        let c = |name: &'static str| MetricBuilder::new(metrics).counter(name, partition);
        Self {
            provider_calls: c("crypto_provider_calls"),
            modules: c("crypto_modules_decrypted"),
            chunks: c("crypto_chunks_decrypted"),
            page_ranges: c("crypto_page_ranges_decrypted"),
            ahead: c("crypto_chunks_decrypted_ahead"),
        }
    }
}

impl std::fmt::Debug for DecryptingReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecryptingReader")
            .field("file", &self.dec.file)
            .finish_non_exhaustive()
    }
}

impl DecryptingReader {
    pub(crate) fn new(
        inner: Box<dyn AsyncFileReader + Send>,
        file: String,
        size: u64,
        hint: Option<usize>,
        keys: Arc<ScanKeys>,
        counters: Counters,
    ) -> Self {
        Self {
            inner: std::sync::Mutex::new(inner),
            dec: FileDecryptor {
                file,
                keys,
                counters,
            },
            size,
            hint,
            view: None,
            footer_start: 0,
            small: HashMap::new(),
            prefetched: HashMap::new(),
            ahead: HashMap::new(),
            last_row_group: None,
            views: None,
        }
    }

    /// Shares file views with the other readers of `views` (a scan's).
    pub(crate) fn with_views(mut self, views: Arc<Views>) -> Self {
        self.views = Some(views);
        self
    }

    /// Where views of this file may be found and kept: the scan's, then (for plaintext
    /// files of scans that give no keys of their own) all scans'.
    fn caches(&self, plaintext: bool) -> impl Iterator<Item = &Views> {
        let all = (plaintext && self.dec.keys.given.is_none()).then(Views::plaintext);
        self.views.as_deref().into_iter().chain(all)
    }

    /// [`Self::fetch`], taking a prefetched buffer of exactly this range (so that it can be
    /// decrypted in place).
    pub(crate) async fn fetch_owned(
        &mut self,
        range: Range<u64>,
    ) -> parquet::errors::Result<Bytes> {
        if let Some(b) = self.prefetched.remove(&range) {
            return Ok(b);
        }
        self.fetch(range).await
    }

    fn inner(&mut self) -> &mut Box<dyn AsyncFileReader + Send> {
        self.inner
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) async fn fetch(&mut self, range: Range<u64>) -> parquet::errors::Result<Bytes> {
        // Fetched for the current request (kept until it is served).
        if let Some((r, b)) = self
            .prefetched
            .iter()
            .find(|(r, _)| r.start <= range.start && range.end <= r.end)
        {
            let at = (range.start - r.start) as usize;
            return Ok(b.slice(at..at + (range.end - range.start) as usize));
        }
        self.inner().get_bytes(range).await
    }

    pub(crate) async fn view(&mut self) -> parquet::errors::Result<Arc<View>> {
        if let Some(v) = &self.view {
            return Ok(Arc::clone(v));
        }
        let cached = self
            .caches(true)
            .find_map(|c| c.view(&self.dec.file, self.size));
        clearice_metrics::cache_lookup(clearice_metrics::Cache::Footer, cached.is_some());
        if let Some(v) = cached {
            self.view = Some(Arc::clone(&v));
            return Ok(v);
        }
        let v = Arc::new(self.build_view().await?);
        for c in self.caches(is_plaintext(&v)) {
            c.keep_view(&self.dec.file, self.size, &v);
        }
        self.view = Some(Arc::clone(&v));
        Ok(v)
    }

    async fn get_ranges(&mut self, ranges: Vec<Range<u64>>) -> parquet::errors::Result<Vec<Bytes>> {
        let view = self.view().await?;
        let Some(crypto) = &view.crypto else {
            return self.inner().get_byte_ranges(ranges).await;
        };
        self.prefetched.clear();
        let mut out: Vec<Option<Bytes>> = vec![None; ranges.len()];
        // Whole column chunks asked for (a row group's projected columns): (request index,
        // region index).
        let chunks: Vec<(usize, usize)> = ranges
            .iter()
            .enumerate()
            .filter_map(|(idx, r)| whole_chunk(&crypto.regions, r).map(|at| (idx, at)))
            .collect();
        // Those decrypted ahead are taken as they are (not fetched again).
        let mut ready = Vec::new();
        for (idx, at) in &chunks {
            if let Some(task) = self.ahead.remove(at) {
                ready.push((*idx, task));
            }
        }
        // By request index (flags, not searches: a request may name thousands of columns).
        let mut from_ahead = vec![false; ranges.len()];
        for (idx, _) in &ready {
            from_ahead[*idx] = true;
        }
        let next = self.plan_ahead(&crypto.regions, &chunks);
        let mut plain_idx = Vec::new();
        let mut is_plain = vec![false; ranges.len()];
        for (i, r) in ranges.iter().enumerate() {
            if overlapping(&crypto.regions, r).is_empty() {
                plain_idx.push(i);
                is_plain[i] = true;
            }
        }
        // Whole regions the requests need, fetched with the plaintext ranges in one call
        // (one coalesced GET per row group on object stores) before decrypting.
        let mut wanted: Vec<Range<u64>> = Vec::new();
        let mut wanted_set: HashSet<Range<u64>> = HashSet::new();
        for (i, r) in ranges.iter().enumerate() {
            if is_plain[i] || from_ahead[i] {
                continue;
            }
            let hits = overlapping(&crypto.regions, r);
            let covered = covered(&crypto.regions, &hits, r);
            if covered < r.end - r.start {
                // Plaintext bytes around encrypted regions (page indexes of several columns):
                // one read of the request serves them all.
                wanted.push(r.clone());
            }
            for j in hits {
                let region = &crypto.regions[j];
                if covered < r.end - r.start
                    && region.range.start >= r.start
                    && region.range.end <= r.end
                {
                    continue;
                }
                let fetch = match &region.kind {
                    RegionKind::Chunk { units, .. } => {
                        let sub = region.range.start.max(r.start)..region.range.end.min(r.end);
                        if sub == region.range {
                            Some(region.range.clone())
                        } else {
                            // A page range: the encrypted pages behind it.
                            units
                                .get()
                                .and_then(|u| page_span(u, &sub).map(|(a, b)| u_enc(u, a, b)))
                        }
                    }
                    RegionKind::Synthetic(_) | RegionKind::Refused(_) => None,
                    _ => (!self.small.contains_key(&j)).then(|| region.range.clone()),
                };
                if let Some(f) = fetch
                    && wanted_set.insert(f.clone())
                {
                    wanted.push(f);
                }
            }
        }
        let mut next_enc = Vec::new();
        if !plain_idx.is_empty() || !wanted.is_empty() || !next.is_empty() {
            let mut all: Vec<Range<u64>> = plain_idx.iter().map(|i| ranges[*i].clone()).collect();
            all.extend(wanted.iter().cloned());
            all.extend(next.iter().map(|at| crypto.regions[*at].range.clone()));
            let mut fetched = self.inner().get_byte_ranges(all).await?;
            next_enc = fetched.split_off(plain_idx.len() + wanted.len());
            let encrypted = fetched.split_off(plain_idx.len());
            for (i, b) in plain_idx.into_iter().zip(fetched) {
                out[i] = Some(b);
            }
            self.prefetched.extend(wanted.into_iter().zip(encrypted));
        }
        // The other whole chunks are decrypted concurrently: a remote provider answers
        // them in parallel.
        let mut whole = Vec::with_capacity(chunks.len());
        for (idx, at) in chunks {
            if !from_ahead[idx] {
                // Owned (not shared), so a released key decrypts it in place.
                let enc = self.fetch_owned(ranges[idx].clone()).await?;
                whole.push((idx, at, enc));
            }
        }
        let places: Vec<usize> = whole.iter().map(|(idx, _, _)| *idx).collect();
        let decrypting = whole
            .into_iter()
            .map(|(_, at, enc)| self.dec.decrypt_chunk(crypto, at, enc));
        let plains = futures::future::try_join_all(decrypting).await?;
        for (idx, plain) in places.into_iter().zip(plains) {
            out[idx] = Some(plain);
        }
        for (idx, task) in ready {
            out[idx] = Some(
                task.join_unwind()
                    .await
                    .map_err(|e| parquet::errors::ParquetError::External(Box::new(e)))??,
            );
        }
        // The next row group's chunks are decrypted while the reader decodes these.
        for (at, enc) in next.into_iter().zip(next_enc) {
            let (dec, view) = (self.dec.clone(), Arc::clone(&view));
            self.dec.counters.ahead.add(1);
            let task = SpawnedTask::spawn(async move {
                let crypto = view.crypto.as_ref().expect("encrypted file");
                dec.decrypt_chunk(crypto, at, enc).await
            });
            self.ahead.insert(at, task);
        }
        self.page_ranges(crypto, &ranges, &mut out).await?;
        for (i, r) in ranges.iter().enumerate() {
            if out[i].is_none() {
                out[i] = Some(self.serve(&view, r.clone()).await?);
            }
        }
        self.prefetched.clear();
        Ok(out.into_iter().map(|b| b.expect("filled")).collect())
    }

    /// The chunks to decrypt ahead of a request for whole `chunks` of one row group: the
    /// same columns in the next row group, when the reader reads row groups in order and
    /// the provider decrypts them (a released key decrypts in process: nothing to wait
    /// for). Chunks decrypted ahead for other row groups are dropped: they will not be
    /// asked for.
    fn plan_ahead(&mut self, regions: &[Region], chunks: &[(usize, usize)]) -> Vec<usize> {
        let Some((_, first)) = chunks.first() else {
            return Vec::new();
        };
        let rg = regions[*first].row_group;
        if chunks.iter().any(|(_, at)| regions[*at].row_group != rg) {
            return Vec::new();
        }
        let in_order = self.last_row_group.is_none_or(|last| rg >= last);
        self.last_row_group = Some(rg);
        self.ahead
            .retain(|at, _| (rg..=rg + 1).contains(&regions[*at].row_group));
        if !in_order || tokio::runtime::Handle::try_current().is_err() {
            return Vec::new();
        }
        let by_provider =
            |r: &Region| matches!(&r.kind, RegionKind::Chunk { key, .. } if key.cipher.is_none());
        if !chunks.iter().any(|(_, at)| by_provider(&regions[*at])) {
            return Vec::new();
        }
        // The next row group's chunks by column: one pass (a file may have thousands of
        // columns).
        let next: HashMap<usize, usize> = regions
            .iter()
            .enumerate()
            .filter(|(_, r)| r.row_group == rg + 1 && by_provider(r))
            .map(|(at, r)| (r.ordinal, at))
            .collect();
        chunks
            .iter()
            .filter(|(_, at)| by_provider(&regions[*at]))
            .filter_map(|(_, at)| next.get(&regions[*at].ordinal).copied())
            .filter(|at| !self.ahead.contains_key(at))
            .collect()
    }

    /// The plaintext view of `range`, which overlaps encrypted regions.
    async fn serve(&mut self, view: &View, range: Range<u64>) -> parquet::errors::Result<Bytes> {
        let crypto = view.crypto.as_ref().expect("encrypted file");
        let hits = overlapping(&crypto.regions, &range);
        // Inside one region: its plaintext is the answer (no copy).
        if let [i] = hits[..]
            && crypto.regions[i].range.start <= range.start
            && range.end <= crypto.regions[i].range.end
        {
            return self.image(crypto, i, range).await;
        }
        self.small_regions(crypto, &hits).await?;
        let covered = covered(&crypto.regions, &hits, &range);
        let mut out = if covered < range.end - range.start {
            BytesMut::from(&self.fetch(range.clone()).await?[..])
        } else {
            BytesMut::zeroed((range.end - range.start) as usize)
        };
        for i in hits {
            let region = &crypto.regions[i];
            let sub = region.range.start.max(range.start)..region.range.end.min(range.end);
            let image = self.image(crypto, i, sub.clone()).await?;
            let at = (sub.start - range.start) as usize;
            out[at..at + image.len()].copy_from_slice(&image);
        }
        Ok(out.freeze())
    }
}

/// A view of a file without any encryption: no key went into it.
fn is_plaintext(view: &View) -> bool {
    view.crypto.is_none() && view.column_keys.iter().all(|(_, k)| k.is_none())
}

/// Names the file in errors that do not already (ours always do).
fn named(path: &str, e: parquet::errors::ParquetError) -> parquet::errors::ParquetError {
    use parquet::errors::ParquetError;
    match e {
        ParquetError::External(e) if e.is::<DecryptError>() => ParquetError::External(e),
        e => {
            let msg = e.to_string();
            if msg.contains(path) {
                e
            } else {
                ParquetError::General(format!("file '{path}': {msg}"))
            }
        }
    }
}

impl AsyncFileReader for DecryptingReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        async move {
            let mut v = self
                .get_ranges(vec![range])
                .await
                .map_err(|e| named(&self.dec.file, e))?;
            Ok(v.pop().expect("one range"))
        }
        .boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        async move {
            self.get_ranges(ranges)
                .await
                .map_err(|e| named(&self.dec.file, e))
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        async move {
            let view = self.view().await.map_err(|e| named(&self.dec.file, e))?;
            let column = options.map_or(PageIndexPolicy::Skip, |o| o.column_index_policy());
            let offset = options.map_or(PageIndexPolicy::Skip, |o| o.offset_index_policy());
            if column == PageIndexPolicy::Skip && offset == PageIndexPolicy::Skip {
                return Ok(Arc::clone(&view.metadata));
            }
            let which = format!("{column:?}/{offset:?}");
            let plaintext = is_plaintext(&view);
            if let Some(m) = self
                .caches(plaintext)
                .find_map(|c| c.indexed(&self.dec.file, self.size, &which))
            {
                return Ok(m);
            }
            let mut reader =
                ParquetMetaDataReader::new_with_metadata(view.metadata.as_ref().clone())
                    .with_column_index_policy(column)
                    .with_offset_index_policy(offset);
            reader.load_page_index(&mut *self).await?;
            let m = Arc::new(reader.finish().map_err(|e| named(&self.dec.file, e))?);
            for c in self.caches(plaintext) {
                c.keep_indexed(&self.dec.file, self.size, &which, &m);
            }
            Ok(m)
        }
        .boxed()
    }
}
