//! Tables as last loaded, by metadata file: a statement over a table whose metadata has
//! not changed reuses the `Table` the previous one planned with, and so the manifest
//! lists and manifests iceberg-rust cached in it (a metadata file is never rewritten:
//! the same location is the same table). Every statement still asks the catalog for the
//! table's current metadata file. Tables Iceberg encrypts itself are never kept.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use iceberg::table::Table;

/// Tables kept (each with its own bounded manifest cache) before the map starts over.
const TABLES: usize = 32;

static LOADED: LazyLock<Mutex<HashMap<String, Table>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The table kept for `fresh`'s metadata file if it is the same table read the same
/// way (identifier and file IO properties: a catalog's vended credentials change them),
/// else `fresh`, now kept.
pub(crate) fn reuse(fresh: Table) -> Table {
    let Some(location) = fresh.metadata_location().map(str::to_owned) else {
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
    if let Some(kept) = loaded.get(&location)
        && kept.identifier() == fresh.identifier()
        && kept.file_io().config() == fresh.file_io().config()
        && kept.readonly() == fresh.readonly()
    {
        return kept.clone();
    }
    if loaded.len() >= TABLES {
        loaded.clear();
    }
    loaded.insert(location, fresh.clone());
    fresh
}
