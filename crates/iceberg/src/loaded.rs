//! Tables as last loaded, by identifier and runtime: a statement over a table whose
//! metadata file has not changed reuses the `Table` the previous one planned with, and so
//! the manifest lists and manifests iceberg-rust cached in it (a metadata file is never
//! rewritten: the same location is the same table). Every statement still asks the
//! catalog for the table's current metadata file. Tables Iceberg encrypts itself are never
//! kept.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use iceberg::table::Table;

/// Tables kept (each with its own bounded manifest cache) before the map starts over.
const TABLES: usize = 32;

/// By table identifier and runtime: one version of each table (a table committed to
/// often replaces its kept version rather than filling the map).
static LOADED: LazyLock<Mutex<HashMap<(String, tokio::runtime::Id), Table>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The table kept for `fresh`'s identifier if it is the same metadata file read the same
/// way (file IO properties: a catalog's vended credentials change them), else `fresh`,
/// now kept.
pub(crate) fn reuse(fresh: Table) -> Table {
    let Some(location) = fresh.metadata_location().map(str::to_owned) else {
        return fresh;
    };
    // iceberg-rust plans a table's files on the runtime it was loaded in: on a runtime
    // that has ended, its planning tasks never run and the scan sees no files at all (an
    // empty result, not an error). A table is reused only within its own runtime.
    let Ok(runtime) = tokio::runtime::Handle::try_current().map(|h| h.id()) else {
        return fresh;
    };
    // A table Iceberg encrypts itself holds unwrapped keys (and metadata decrypted with
    // them): loaded anew each statement, so a key the KMS stops granting stops working
    // within `[kms] key_cache_ttl_s`, never kept alive by this map.
    if fresh
        .metadata()
        .properties()
        .contains_key(crate::native::TABLE_KEY_PROPERTY)
    {
        return fresh;
    }
    let mut loaded = LOADED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let key = (fresh.identifier().to_string(), runtime);
    if let Some(kept) = loaded.get(&key)
        && kept.metadata_location() == Some(location.as_str())
        && kept.file_io().config() == fresh.file_io().config()
        && kept.readonly() == fresh.readonly()
    {
        clearice_metrics::cache_lookup(clearice_metrics::Cache::Table, true);
        return kept.clone();
    }
    clearice_metrics::cache_lookup(clearice_metrics::Cache::Table, false);
    if loaded.len() >= TABLES && !loaded.contains_key(&key) {
        loaded.clear();
    }
    loaded.insert(key, fresh.clone());
    fresh
}
