//! `clearice keys rotate`: master key rotation without rewriting data files.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clearice_crypto::{
    AwsKms, DEFAULT_KEY_CACHE_TTL, KeyResolver, KeyringKms, Kms, rotate_side_file,
};

use crate::config::{Config, KmsKind};
use crate::error::{Error, Result};

/// What a rotation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RotationReport {
    /// The keyring's new version number of the master key (`None`: the KMS versions its
    /// keys itself, e.g. AWS KMS).
    pub keyring_version: Option<usize>,
    /// Side files rewritten.
    pub side_files: usize,
    /// Key material records re-wrapped.
    pub keys: usize,
}

/// Rotates `master_key_id`: a new keyring version (the keyring KMS; AWS KMS rotates its
/// key material itself), then every external key material side file under `roots`
/// (default: the catalogs' `file://` warehouses) re-wrapped under it. The keyring is
/// written first (atomically), so a failure midway leaves every file readable. File IO
/// runs on blocking threads; the KMS is called asynchronously.
pub async fn rotate_master_key(
    config: &Config,
    master_key_id: &str,
    roots: &[PathBuf],
) -> Result<RotationReport> {
    let bad = |key: &str, reason: String| Error::ConfigValue {
        path: config.source.clone(),
        key: key.into(),
        reason,
    };
    let kms_config = config
        .kms
        .as_ref()
        .ok_or_else(|| bad("kms", "no [kms] to rotate a master key in".into()))?;
    let (kms, keyring_version): (Arc<dyn Kms>, Option<usize>) = match kms_config.kind {
        KmsKind::Keyring => {
            let path = config.resolve(kms_config.path.as_ref().expect("validated at load"));
            let id = master_key_id.to_owned();
            let (keyring, version) = blocking(config, move || {
                let mut keyring = KeyringKms::from_file(&path)?;
                let version = keyring.rotate(&id)?;
                write_atomically(&path, keyring.to_json().as_bytes(), true)?;
                Ok((keyring, version))
            })
            .await?;
            (Arc::new(keyring), Some(version))
        }
        KmsKind::Aws => {
            let aws = kms_config.aws();
            let kms = blocking(config, move || Ok(AwsKms::new(&aws)?)).await?;
            (Arc::new(kms), None)
        }
    };
    let resolver = KeyResolver::new(
        Some(Arc::clone(&kms)),
        Default::default(),
        DEFAULT_KEY_CACHE_TTL,
    );
    let mut roots = roots.to_vec();
    if roots.is_empty() {
        for cat in config.catalogs.values() {
            if let Some(p) = cat
                .warehouse
                .as_deref()
                .and_then(|w| w.strip_prefix("file://"))
            {
                roots.push(PathBuf::from(p));
            }
        }
    }
    let side_files = blocking(config, move || {
        let mut side_files = Vec::new();
        for r in &roots {
            collect_side_files(r, &mut side_files).map_err(|e| Error::ConfigValue {
                path: r.display().to_string(),
                key: "keys rotate".into(),
                reason: e.to_string(),
            })?;
        }
        Ok(side_files)
    })
    .await?;
    let mut report = RotationReport {
        keyring_version,
        side_files: 0,
        keys: 0,
    };
    for f in side_files {
        let shown = f.display().to_string();
        let (file, path) = (f.clone(), shown.clone());
        let text = blocking(config, move || {
            #[expect(clippy::disallowed_methods, reason = "on a blocking thread")]
            let text = std::fs::read_to_string(&file).map_err(|e| {
                clearice_crypto::Error::ExternalKeyMaterial {
                    path,
                    reason: e.to_string(),
                }
            })?;
            Ok(text)
        })
        .await?;
        let (new, changed) =
            rotate_side_file(&text, &shown, master_key_id, &resolver, kms.as_ref()).await?;
        if changed > 0 {
            blocking(config, move || write_atomically(&f, new.as_bytes(), false)).await?;
            report.side_files += 1;
            report.keys += changed;
        }
    }
    Ok(report)
}

/// Runs `f` (file IO) on a blocking thread.
async fn blocking<T: Send + 'static>(
    config: &Config,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::ConfigValue {
            path: config.source.clone(),
            key: "keys rotate".into(),
            reason: format!("rotation task failed: {e}"),
        })?
}

fn collect_side_files(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    #[expect(clippy::disallowed_methods, reason = "called on a blocking thread")]
    let entries = std::fs::read_dir(dir)?;
    for e in entries {
        let e = e?;
        let path = e.path();
        if e.file_type()?.is_dir() {
            collect_side_files(&path, out)?;
        } else if e
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with("_KEY_MATERIAL_FOR_") && n.ends_with(".json"))
        {
            out.push(path);
        }
    }
    Ok(())
}

/// Writes `path` through a temporary file and a rename (owner-only when `private`).
#[expect(clippy::disallowed_methods, reason = "called on a blocking thread")]
fn write_atomically(path: &Path, bytes: &[u8], private: bool) -> Result<()> {
    use std::io::Write;
    let fail = |e: std::io::Error| clearice_crypto::Error::ExternalKeyMaterial {
        path: path.display().to_string(),
        reason: e.to_string(),
    };
    let tmp = path.with_extension("rotating");
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let _ = private;
    let mut f = opts.open(&tmp).map_err(fail)?;
    f.write_all(bytes).map_err(fail)?;
    f.sync_all().map_err(fail)?;
    std::fs::rename(&tmp, path).map_err(fail)?;
    Ok(())
}
