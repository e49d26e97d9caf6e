//! The process's series: one registry, created on first use, recorded into by every
//! layer (the engine's statements, Flight's logins and sessions, the crypto layer's KMS
//! and provider calls and decrypted bytes, the caches, the cluster worker and the
//! crypto-server) and encoded by the endpoint.
//!
//! Label values are fixed words of the code, names from the configuration (a KMS kind, a
//! provider name) or an authenticated principal's name, never text a peer sends: a
//! login failure is counted by reason, not by the name tried. Distinct principals are
//! bounded ([`MAX_PRINCIPALS`]); later ones are counted as [`OTHER_PRINCIPAL`].

use std::collections::HashSet;
use std::sync::{LazyLock, Mutex, OnceLock};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// Distinct principal label values kept; later principals count as [`OTHER_PRINCIPAL`].
pub const MAX_PRINCIPALS: usize = 1000;
/// The principal label of principals beyond [`MAX_PRINCIPALS`].
pub const OTHER_PRINCIPAL: &str = "(other)";

/// How a statement ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// It ran to its end.
    Ok,
    /// The policy refused it (a denied table or column, a write rule, confinement).
    Denied,
    /// A limit stopped it (timeout, memory, rows, concurrency).
    Limited,
    /// The client went away before its end.
    Cancelled,
    /// Any other error (SQL, a file, a key).
    Error,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Denied => "denied",
            Self::Limited => "limited",
            Self::Cancelled => "cancelled",
            Self::Error => "error",
        }
    }
}

/// Why a login or an authenticated call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LoginFailure {
    /// No credentials.
    Missing,
    /// Not `Basic` or `Bearer` credentials, or unreadable.
    Malformed,
    /// A wrong user name or password.
    InvalidCredentials,
    /// An unknown or expired bearer token.
    InvalidToken,
    /// Refused before checking, after too many failures.
    Throttled,
}

impl LoginFailure {
    fn label(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Malformed => "malformed",
            Self::InvalidCredentials => "invalid_credentials",
            Self::InvalidToken => "invalid_token",
            Self::Throttled => "throttled",
        }
    }
}

/// The caches whose lookups are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cache {
    /// Loaded Iceberg tables (metadata file, manifest lists, manifests).
    Table,
    /// Decrypted Parquet footers (per file and key scope).
    Footer,
    /// Per-file statistics for planning.
    FileStatistics,
    /// Key-encryption keys unwrapped by the KMS.
    KeyEncryptionKey,
    /// Data keys of files.
    DataKey,
}

impl Cache {
    fn label(self) -> &'static str {
        match self {
            Self::Table => "table",
            Self::Footer => "footer",
            Self::FileStatistics => "file_statistics",
            Self::KeyEncryptionKey => "key_encryption_key",
            Self::DataKey => "data_key",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatementLabels {
    principal: String,
    kind: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PrincipalLabels {
    principal: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AlgorithmLabels {
    algorithm: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    /// The KMS kind or provider name (configuration).
    target: String,
    operation: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallTimeLabels {
    target: String,
    operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheLabels {
    cache: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceCallLabels {
    operation: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabels {
    version: &'static str,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Latency buckets: 1 ms to about 65 s, doubling.
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// What a scrape asks of the memory pool: (reserved bytes, limit in bytes if bounded).
type PoolReader = Box<dyn Fn() -> (usize, Option<usize>) + Send + Sync>;

struct Families {
    registry: Registry,
    statements: Family<StatementLabels, Counter>,
    statement_seconds: Histograms<KindLabels>,
    running_statements: Gauge,
    result_rows: Family<PrincipalLabels, Counter>,
    result_bytes: Family<PrincipalLabels, Counter>,
    decrypted_gcm: Counter,
    decrypted_ctr: Counter,
    kms_calls: Family<CallLabels, Counter>,
    kms_seconds: Histograms<CallTimeLabels>,
    provider_calls: Family<CallLabels, Counter>,
    provider_seconds: Histograms<CallTimeLabels>,
    cache: Family<CacheLabels, Counter>,
    sessions: Gauge,
    prepared: Gauge,
    login_failures: Family<ReasonLabels, Counter>,
    worker_tasks: Family<OutcomeLabels, Counter>,
    service_calls: Family<ServiceCallLabels, Counter>,
    service_seconds: Histograms<OperationLabels>,
    principals: Mutex<HashSet<String>>,
}

/// The memory pool a scrape reads (the process's engine sets it).
static POOL: OnceLock<Mutex<Option<PoolReader>>> = OnceLock::new();

#[derive(Debug)]
struct PoolCollector;

impl Collector for PoolCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(Some((reserved, limit))) = POOL.get().map(|p| {
            p.lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .map(|f| f())
        }) else {
            return Ok(());
        };
        let g = ConstGauge::new(i64::try_from(reserved).unwrap_or(i64::MAX));
        g.encode(encoder.encode_descriptor(
            "memory_pool_reserved",
            "Bytes the query memory pool has handed out",
            Some(&Unit::Bytes),
            g.metric_type(),
        )?)?;
        if let Some(limit) = limit {
            let g = ConstGauge::new(i64::try_from(limit).unwrap_or(i64::MAX));
            g.encode(encoder.encode_descriptor(
                "memory_pool_limit",
                "Bytes the query memory pool may hand out",
                Some(&Unit::Bytes),
                g.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

static FAMILIES: LazyLock<Families> = LazyLock::new(|| {
    let mut registry = Registry::with_prefix("clearice");
    let f = Families {
        registry: Registry::default(),
        statements: Family::default(),
        statement_seconds: Family::new_with_constructor(latency),
        running_statements: Gauge::default(),
        result_rows: Family::default(),
        result_bytes: Family::default(),
        decrypted_gcm: Counter::default(),
        decrypted_ctr: Counter::default(),
        kms_calls: Family::default(),
        kms_seconds: Family::new_with_constructor(latency),
        provider_calls: Family::default(),
        provider_seconds: Family::new_with_constructor(latency),
        cache: Family::default(),
        sessions: Gauge::default(),
        prepared: Gauge::default(),
        login_failures: Family::default(),
        worker_tasks: Family::default(),
        service_calls: Family::default(),
        service_seconds: Family::new_with_constructor(latency),
        principals: Mutex::default(),
    };
    let info: Family<VersionLabels, Gauge> = Family::default();
    info.get_or_create(&VersionLabels {
        version: env!("CARGO_PKG_VERSION"),
    })
    .set(1);
    registry.register("build_info", "ClearIce's version (value 1)", info);
    registry.register(
        "statements",
        "Statements ended, by principal, statement kind and outcome",
        f.statements.clone(),
    );
    registry.register_with_unit(
        "statement_duration",
        "Time from a statement's start to its end (its last row read), by kind",
        Unit::Seconds,
        f.statement_seconds.clone(),
    );
    registry.register(
        "running_statements",
        "Statements started and not yet ended",
        f.running_statements.clone(),
    );
    registry.register(
        "result_rows",
        "Rows returned to principals",
        f.result_rows.clone(),
    );
    registry.register_with_unit(
        "result",
        "Bytes of Arrow data returned to principals",
        Unit::Bytes,
        f.result_bytes.clone(),
    );
    let decrypted: Family<AlgorithmLabels, Counter> = Family::default();
    // The two counters are registered once through a family, and recorded into directly
    // (one atomic add per Parquet module).
    let gcm = decrypted.get_or_create_owned(&AlgorithmLabels {
        algorithm: "AES_GCM_V1",
    });
    let ctr = decrypted.get_or_create_owned(&AlgorithmLabels {
        algorithm: "AES_GCM_CTR_V1",
    });
    registry.register_with_unit(
        "decrypted",
        "Ciphertext bytes of Parquet modules decrypted, by the file's PME algorithm",
        Unit::Bytes,
        decrypted,
    );
    registry.register(
        "kms_requests",
        "Requests to the KMS (target: its kind), by operation and outcome",
        f.kms_calls.clone(),
    );
    registry.register_with_unit(
        "kms_request_duration",
        "KMS request latency",
        Unit::Seconds,
        f.kms_seconds.clone(),
    );
    registry.register(
        "provider_requests",
        "Requests to remote crypto providers (target: the provider's name), by operation and outcome",
        f.provider_calls.clone(),
    );
    registry.register_with_unit(
        "provider_request_duration",
        "Remote crypto provider request latency (retries included)",
        Unit::Seconds,
        f.provider_seconds.clone(),
    );
    registry.register(
        "cache_requests",
        "Cache lookups, by cache and result (hit or miss)",
        f.cache.clone(),
    );
    registry.register(
        "sessions",
        "Flight SQL sessions (bearer tokens issued and not yet pruned)",
        f.sessions.clone(),
    );
    registry.register(
        "prepared_statements",
        "Flight SQL prepared statements held",
        f.prepared.clone(),
    );
    registry.register(
        "login_failures",
        "Refused logins and calls, by reason (throttled: refused before checking)",
        f.login_failures.clone(),
    );
    registry.register(
        "worker_requests",
        "Calls a cluster worker answered: stage plans admitted or refused, calls not signed",
        f.worker_tasks.clone(),
    );
    registry.register(
        "crypto_server_requests",
        "Requests the crypto-server answered, by operation and outcome",
        f.service_calls.clone(),
    );
    registry.register_with_unit(
        "crypto_server_request_duration",
        "crypto-server request latency, by operation",
        Unit::Seconds,
        f.service_seconds.clone(),
    );
    registry.register_collector(Box::new(PoolCollector));
    Families {
        registry,
        decrypted_gcm: gcm,
        decrypted_ctr: ctr,
        ..f
    }
});

fn families() -> &'static Families {
    &FAMILIES
}

/// The principal's label value: its name, or [`OTHER_PRINCIPAL`] once
/// [`MAX_PRINCIPALS`] others were seen.
fn principal(name: &str) -> String {
    let mut seen = families()
        .principals
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if seen.contains(name) {
        return name.to_owned();
    }
    if seen.len() >= MAX_PRINCIPALS {
        return OTHER_PRINCIPAL.to_owned();
    }
    seen.insert(name.to_owned());
    name.to_owned()
}

/// The registry, encoded as OpenMetrics text (`openmetrics`) or Prometheus text 0.0.4.
pub fn encode(openmetrics: bool) -> String {
    let mut out = String::new();
    let registry = &families().registry;
    let done = if openmetrics {
        prometheus_client::encoding::text::encode(&mut out, registry)
    } else {
        prometheus_client::encoding::prometheus_text::encode(&mut out, registry)
    };
    // Writing into a String does not fail.
    debug_assert!(done.is_ok());
    out
}

/// A statement began; the returned guard counts it as running until dropped.
pub fn statement_started() -> Running {
    families().running_statements.inc();
    Running(())
}

/// Counts a statement as running while it lives.
#[derive(Debug)]
pub struct Running(());

impl Drop for Running {
    fn drop(&mut self) {
        families().running_statements.dec();
    }
}

/// A statement of `kind` (a fixed word: `select`, `insert`, ...) by `principal` ended
/// with `outcome` after `elapsed`.
pub fn statement_ended(
    principal_name: &str,
    kind: &'static str,
    outcome: Outcome,
    elapsed: Duration,
) {
    let f = families();
    f.statements
        .get_or_create(&StatementLabels {
            principal: principal(principal_name),
            kind,
            outcome: outcome.label(),
        })
        .inc();
    f.statement_seconds
        .get_or_create(&KindLabels { kind })
        .observe(elapsed.as_secs_f64());
}

/// `rows` rows of `bytes` Arrow bytes were returned to `principal`.
pub fn returned(principal_name: &str, rows: u64, bytes: u64) {
    let f = families();
    let labels = PrincipalLabels {
        principal: principal(principal_name),
    };
    f.result_rows.get_or_create(&labels).inc_by(rows);
    f.result_bytes.get_or_create(&labels).inc_by(bytes);
}

/// `bytes` of ciphertext were decrypted, of a file in `AES_GCM_CTR_V1` (`ctr`) or
/// `AES_GCM_V1`.
pub fn decrypted(ctr: bool, bytes: usize) {
    let f = families();
    let c = if ctr {
        &f.decrypted_ctr
    } else {
        &f.decrypted_gcm
    };
    c.inc_by(bytes as u64);
}

/// A KMS (`kind`: its configured type) answered `operation` (`wrap`, `unwrap`) after
/// `elapsed`, successfully or not.
pub fn kms_call(kind: &str, operation: &'static str, ok: bool, elapsed: Duration) {
    let f = families();
    f.kms_calls
        .get_or_create(&CallLabels {
            target: kind.to_owned(),
            operation,
            outcome: if ok { "ok" } else { "error" },
        })
        .inc();
    f.kms_seconds
        .get_or_create(&CallTimeLabels {
            target: kind.to_owned(),
            operation,
        })
        .observe(elapsed.as_secs_f64());
}

/// The remote provider `name` (configured) answered `operation` (the protocol's path
/// without its slash) after `elapsed`, successfully or not.
pub fn provider_call(name: &str, operation: &'static str, ok: bool, elapsed: Duration) {
    let f = families();
    f.provider_calls
        .get_or_create(&CallLabels {
            target: name.to_owned(),
            operation,
            outcome: if ok { "ok" } else { "error" },
        })
        .inc();
    f.provider_seconds
        .get_or_create(&CallTimeLabels {
            target: name.to_owned(),
            operation,
        })
        .observe(elapsed.as_secs_f64());
}

/// A lookup in `cache` found its entry (`hit`) or not.
pub fn cache_lookup(cache: Cache, hit: bool) {
    families()
        .cache
        .get_or_create(&CacheLabels {
            cache: cache.label(),
            result: if hit { "hit" } else { "miss" },
        })
        .inc();
}

/// Flight SQL now holds `n` sessions.
pub fn sessions(n: usize) {
    families()
        .sessions
        .set(i64::try_from(n).unwrap_or(i64::MAX));
}

/// Flight SQL now holds `n` prepared statements.
pub fn prepared_statements(n: usize) {
    families()
        .prepared
        .set(i64::try_from(n).unwrap_or(i64::MAX));
}

/// A login or an authenticated call was refused.
pub fn login_failed(reason: LoginFailure) {
    families()
        .login_failures
        .get_or_create(&ReasonLabels {
            reason: reason.label(),
        })
        .inc();
}

/// What a cluster worker did with a call that brings a stage plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkerCall {
    /// The plan was admitted (signed scans only) and runs.
    Admitted,
    /// The plan was refused (a leaf that is not a signed scan, a write, unfair joins).
    Refused,
    /// The call was not signed with the cluster's secret.
    Unauthenticated,
}

/// A cluster worker answered a call as `what` says.
pub fn worker_call(what: WorkerCall) {
    let outcome = match what {
        WorkerCall::Admitted => "admitted",
        WorkerCall::Refused => "refused",
        WorkerCall::Unauthenticated => "unauthenticated",
    };
    families()
        .worker_tasks
        .get_or_create(&OutcomeLabels { outcome })
        .inc();
}

/// The crypto-server answered `operation` (its path's word) with `outcome` (`ok`,
/// `unauthenticated`, `denied`, `bad_request`, `error`) after `elapsed`.
pub fn crypto_server_request(operation: &'static str, outcome: &'static str, elapsed: Duration) {
    let f = families();
    f.service_calls
        .get_or_create(&ServiceCallLabels { operation, outcome })
        .inc();
    f.service_seconds
        .get_or_create(&OperationLabels { operation })
        .observe(elapsed.as_secs_f64());
}

/// Has scrapes report the memory pool `read` describes: (reserved bytes, limit). The
/// last engine of a process to call this is the one reported.
pub fn watch_memory_pool(read: impl Fn() -> (usize, Option<usize>) + Send + Sync + 'static) {
    *POOL
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner()) = Some(Box::new(read));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_are_named_by_prometheus_conventions_carry_what_was_recorded_and_bound_principals() {
        statement_ended("ann", "select", Outcome::Denied, Duration::from_millis(3));
        returned("ann", 5, 640);
        decrypted(true, 100);
        cache_lookup(Cache::Footer, true);
        login_failed(LoginFailure::Throttled);
        let text = encode(false);
        for line in [
            "clearice_statements_total{principal=\"ann\",kind=\"select\",outcome=\"denied\"} 1",
            "clearice_result_rows_total{principal=\"ann\"} 5",
            "clearice_result_bytes_total{principal=\"ann\"} 640",
            "clearice_decrypted_bytes_total{algorithm=\"AES_GCM_CTR_V1\"} 100",
            "clearice_cache_requests_total{cache=\"footer\",result=\"hit\"} 1",
            "clearice_login_failures_total{reason=\"throttled\"} 1",
            "clearice_statement_duration_seconds_bucket{kind=\"select\",le=\"0.004\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        assert!(encode(true).ends_with("# EOF\n"));

        // Principals beyond the bound share one label value (in the same test: the
        // registry is the process's, and a test filling the bound first would turn
        // `ann` above into `(other)`).
        for i in 0..MAX_PRINCIPALS + 5 {
            returned(&format!("p{i}"), 1, 1);
        }
        let text = encode(false);
        let distinct = text
            .lines()
            .filter(|l| l.starts_with("clearice_result_rows_total{"))
            .count();
        assert!(distinct <= MAX_PRINCIPALS + 1, "{distinct} series");
        assert!(text.contains(&format!(
            "clearice_result_rows_total{{principal=\"{OTHER_PRINCIPAL}\"}}"
        )));
    }
}
