//! Integration tests of the decrypting reader against real files: parquet-testing's
//! encrypted files (their explicit keys and key-tools material), files PyArrow writes
//! with every algorithm and layout, compared with parquet-rs's own decryption; and the
//! tampering matrix (every module of every file altered: one error line, no rows).
#![allow(clippy::unwrap_used, reason = "tests: a panic is how a test fails")]
// Tests may block: they are not async workers serving anyone.
#![allow(clippy::disallowed_methods)]

mod reader;
mod tamper;
