//! The policy provider's tests, without the engine: the PyArrow/PyIceberg interop lake
//! opened through `clearice-iceberg`'s SQL catalog, wrapped in this crate's
//! `SessionCatalogProvider` for one principal, queried with a plain DataFusion context.
#![allow(
    clippy::unwrap_used,
    clippy::disallowed_methods,
    missing_docs,
    reason = "tests: a panic is how a test fails"
)]

mod keys;
mod lake;
mod matrix;
