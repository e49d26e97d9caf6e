//! ClearIce's decrypting Parquet reader: presents a PME file to DataFusion's Parquet scan
//! as a plaintext Parquet file, decrypting through a [`CryptoProvider`](clearice_crypto::CryptoProvider) only the modules
//! of the columns a query reads.
//!
//! # The plaintext view
//! Every byte range of the file stays where it is; each encrypted region is replaced by a
//! plaintext *of the same length*:
//! - the footer is decrypted (or its signature verified) and rewritten without crypto
//!   metadata: columns carry their decrypted `ColumnMetaData`, index lengths become
//!   plaintext lengths; it is handed to parquet-rs as
//!   [`ParquetMetaData`](parquet::file::metadata::ParquetMetaData), never as bytes;
//! - a column chunk becomes its pages in plaintext, packed from the chunk's start (each
//!   page header keeps its length: its `compressed_page_size` is rewritten in place),
//!   followed by one `INDEX_PAGE` (which readers skip) filling the bytes the encryption
//!   added. Page sizes follow from module lengths, so the plaintext offset of every page
//!   is known from the encrypted offset index without decrypting any page;
//! - column and offset indexes become their plaintext (offset index locations rewritten
//!   in place to plaintext offsets), followed by zeros; Bloom filters likewise.
//!
//! So DataFusion's row group and page pruning, projection and late materialization work
//! unchanged, and only modules of read columns are ever decrypted: one provider call per
//! column chunk read (or per page range with the page index), never one per page.
//! Columns whose key this scan may not request keep a placeholder: reading their bytes
//! fails with [`DecryptError::Refused`]; their offset index is a one-page stand-in so the
//! page index of the other columns stays usable.
//!
//! # The data path
//! ```text
//! factory   DecryptingReaderFactory: one reader per file of the scan, with its ScanKeys
//!    |
//! reader    DecryptingReader (AsyncFileReader): metadata and byte ranges on request,
//!    |      served from the plaintext view, built once
//! footer    footer read, decrypted or verified, rewritten: the View (plaintext metadata,
//!    |      the encrypted regions, placeholders for refused columns)
//! keys      each key the file names resolved for the scan (scope, then the provider),
//!    |      bound to the column the policy declares it for; modules decrypted under it
//! pages     region plaintexts: whole column chunks, single pages (page index reads),
//!           indexes and Bloom filters
//! ```
// Dependencies nothing uses fail the build (tests add dev-dependencies, so not there).
#![cfg_attr(not(test), deny(unused_crate_dependencies))]
#![forbid(unsafe_code)]
#![allow(
    deprecated,
    reason = "parquet::format holds parquet 58's only public Thrift types (removed in 59)"
)]

mod compact;
mod error;
mod factory;
mod footer;
mod format;
mod keys;
mod pages;
mod reader;
mod rekey;
mod shared;

pub use error::DecryptError;
pub use factory::DecryptingReaderFactory;
pub use format::{DecryptingParquetFormat, DecryptingParquetFormatFactory};
pub use keys::{EXPLICIT_KEY, FileKey, FileKeys, GivenKeys, ScanKeys};
pub use reader::DecryptingReader;
pub use rekey::{ProviderColumnKey, rekey};

type Result<T, E = DecryptError> = std::result::Result<T, E>;
