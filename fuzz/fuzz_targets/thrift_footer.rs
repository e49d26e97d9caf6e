//! The plaintext view's Thrift compact-protocol code (`clearice_pme::compact`) on
//! arbitrary bytes: a decrypted footer, column metadata, page and Bloom filter headers
//! and offset indexes of a file someone handed in. Nothing may panic; patches keep length.
#![no_main]
#![allow(deprecated, reason = "parquet::format: parquet 58's only public Thrift types")]

#[path = "../../crates/pme/src/compact.rs"]
#[allow(dead_code)]
mod compact;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = compact::read::<parquet::format::FileMetaData>(&mut &data[..]);
    let _ = compact::read::<parquet::format::ColumnMetaData>(&mut &data[..]);
    let _ = compact::read::<parquet::format::PageHeader>(&mut &data[..]);
    let _ = compact::offset_index_locations(data);
    let mut header = data.to_vec();
    if compact::rewrite_page_header(&mut header, data.len() as i64).is_some() {
        assert_eq!(header.len(), data.len(), "a patched page header keeps its length");
    }
    let mut bloom = data.to_vec();
    if compact::rewrite_bloom_header(&mut bloom).is_some() {
        assert_eq!(bloom.len(), data.len(), "a patched Bloom header keeps its length");
    }
    if let Some(locations) = compact::offset_index_locations(data) {
        let mut index = data.to_vec();
        let moved = locations.iter().map(|l| (l.offset.wrapping_add(1), l.size.wrapping_sub(1)));
        let _ = compact::patch_offset_index(&mut index, &locations, moved);
    }
});
