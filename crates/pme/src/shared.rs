//! File views shared between readers: by the readers of one scan (its planning and its
//! partitions, which open the same file for their byte ranges), and across scans for
//! plaintext files only (no key is involved). A view of an encrypted file holds the
//! scan's released keys, so it lives only as long as the scan's reader factory.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use parquet::file::metadata::ParquetMetaData;

use crate::footer::View;

/// Views one scan keeps (the rest are built by each reader, as before).
const SCAN_FILES: usize = 256;

/// Plaintext views kept for all scans before the cache starts over.
const PLAIN_FILES: usize = 4096;

/// Views (and their metadata with page indexes loaded) by file name and size.
#[derive(Default)]
pub(crate) struct Views {
    capacity: usize,
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
    capacity: PLAIN_FILES,
    starts_over: true,
    ..Views::default()
});

impl Views {
    /// The views of one scan.
    pub(crate) fn for_scan() -> Self {
        Self {
            capacity: SCAN_FILES,
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
        self.keep(&self.views, (file.to_owned(), size), Arc::clone(view));
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
        );
    }

    fn keep<K: std::hash::Hash + Eq, V>(&self, m: &Mutex<HashMap<K, V>>, k: K, v: V) {
        let mut m = lock(m);
        if m.len() >= self.capacity && !m.contains_key(&k) {
            if !self.starts_over {
                return;
            }
            m.clear();
        }
        m.insert(k, v);
    }
}

fn lock<K, V>(m: &Mutex<HashMap<K, V>>) -> std::sync::MutexGuard<'_, HashMap<K, V>> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
