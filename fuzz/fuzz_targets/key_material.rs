//! PME key material (`clearice_crypto::KeyMaterial::parse`) on arbitrary bytes: the
//! footer's and columns' key metadata of any file a user reads. Nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = clearice_crypto::KeyMaterial::parse(data, Some("fuzz.parquet"));
});
