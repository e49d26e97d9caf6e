//! File views shared between readers: by the readers of one scan (its planning and its
//! partitions, which open the same file for their byte ranges), and across scans for
//! plaintext files only (no key is involved). A view of an encrypted file holds the
//! scan's released keys, so it lives only as long as the scan's reader factory.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use parquet::file::metadata::ParquetMetaData;

use crate::footer::View;

/// Metadata bytes one scan keeps (the rest of its files: each reader builds its own).
const SCAN_BYTES: usize = 64 << 20;

/// Metadata bytes of plaintext files kept for all scans before the cache starts over.
const PLAIN_BYTES: usize = 64 << 20;

/// Views (and their metadata with page indexes loaded) by file name and size.
#[derive(Default)]
pub(crate) struct Views {
    /// Metadata bytes kept at most.
    capacity: usize,
    /// Metadata bytes kept now.
    bytes: Mutex<usize>,
    /// When full: start over (the cache for all scans), else keep no more (a scan).
    starts_over: bool,
    views: Mutex<HashMap<(String, u64), Arc<View>>>,
    /// With page indexes, by file, size and which indexes (`Debug` of the policies).
    indexed: Mutex<HashMap<(String, u64, String), Arc<ParquetMetaData>>>,
}

impl std::fmt::Debug for Views {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Views").finish_non_exhaustive()
    }
}

static PLAIN: LazyLock<Views> = LazyLock::new(|| Views {
    capacity: PLAIN_BYTES,
    starts_over: true,
    ..Views::default()
});

impl Views {
    /// The views of one scan.
    pub(crate) fn for_scan() -> Self {
        Self {
            capacity: SCAN_BYTES,
            ..Self::default()
        }
    }

    /// Views of plaintext files, for every scan.
    pub(crate) fn plaintext() -> &'static Self {
        &PLAIN
    }

    pub(crate) fn view(&self, file: &str, size: u64) -> Option<Arc<View>> {
        lock(&self.views).get(&(file.to_owned(), size)).cloned()
    }

    pub(crate) fn keep_view(&self, file: &str, size: u64, view: &Arc<View>) {
        let bytes = view.metadata.memory_size();
        self.keep(
            &self.views,
            (file.to_owned(), size),
            Arc::clone(view),
            bytes,
        );
    }

    pub(crate) fn indexed(
        &self,
        file: &str,
        size: u64,
        which: &str,
    ) -> Option<Arc<ParquetMetaData>> {
        lock(&self.indexed)
            .get(&(file.to_owned(), size, which.to_owned()))
            .cloned()
    }

    pub(crate) fn keep_indexed(
        &self,
        file: &str,
        size: u64,
        which: &str,
        metadata: &Arc<ParquetMetaData>,
    ) {
        self.keep(
            &self.indexed,
            (file.to_owned(), size, which.to_owned()),
            Arc::clone(metadata),
            metadata.memory_size(),
        );
    }

    fn keep<K: std::hash::Hash + Eq, V>(&self, m: &Mutex<HashMap<K, V>>, k: K, v: V, bytes: usize) {
        let mut total = self
            .bytes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *total + bytes > self.capacity {
            if !self.starts_over || bytes > self.capacity {
                return;
            }
            // Both maps start over (the byte count is theirs together).
            lock(&self.views).clear();
            lock(&self.indexed).clear();
            *total = 0;
        }
        if lock(m).insert(k, v).is_none() {
            *total += bytes;
        }
    }
}

fn lock<K, V>(m: &Mutex<HashMap<K, V>>) -> std::sync::MutexGuard<'_, HashMap<K, V>> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
