//! Reading external key material (side files) for the local crypto provider.

use clearice_crypto::SideFileReader;

/// Reads side files (external key material) from the local filesystem. The local
/// provider calls it on tokio's blocking pool, never on an async worker.
#[expect(
    clippy::disallowed_methods,
    reason = "a blocking read by design: LocalProvider runs it with spawn_blocking"
)]
pub fn local_side_file_reader() -> SideFileReader {
    std::sync::Arc::new(|path: &str| match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    })
}
