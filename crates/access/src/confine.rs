//! Confinement of network sessions (Flight SQL; the shell with `[shell] confine = true`).
//!
//! A network principal is not the machine's user: its statements may read catalog tables
//! under the column policy and nothing else of the server, unless the policy grants it a
//! file area (`[areas.NAME] root/read/write`). Three layers, each enough on its own:
//!
//! ```text
//!  SQL ─▶ planning: URL tables ('path' in FROM) go through ConfinedUrlTableFactory:
//!         the path is resolved (symlinks, ..) and must lie in a readable area, else refused
//!         before any IO (the schema is not even inferred)
//!     ─▶ check_plan(): every node, subqueries and EXPLAIN ANALYZE included: DDL/DML refused,
//!         COPY only into a writable area, listing scans only in readable areas,
//!         SET only for allow-listed options
//!     ─▶ execution: `file://` is AreaStore: every read, list and write is resolved again
//!         and checked against the areas (a symlink planted inside an area, a race)
//! ```
//!
//! Iceberg scans read through their own object store URL ([`CATALOG_STORE_URL`]), so
//! catalog data stays readable while `file://` is confined.

use std::fmt;
use std::ops::Range;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, OnceLock, Weak};

use async_trait::async_trait;
use datafusion::catalog::{TableProvider, UrlTableFactory};
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::datasource::listing::{
    ListingTable, ListingTableConfig, ListingTableConfigExt, ListingTableUrl,
};
use datafusion::datasource::source_as_provider;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::{DdlStatement, LogicalPlan, Statement as PlanStatement};
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use parking_lot::RwLock;

/// Object store URL of Iceberg data files (a local filesystem store registered under its
/// own name, so that `file://` can be confined without hiding catalog data).
pub const CATALOG_STORE_URL: &str = clearice_iceberg::CATALOG_STORE_URL;

/// Session options a confined session may `SET`: they change how results look or how a
/// query is planned, never security, keys, catalogs, files or server-wide resources.
pub const SETTABLE_OPTIONS: &[&str] = &[
    "datafusion.execution.time_zone",
    "datafusion.execution.batch_size",
    "datafusion.sql_parser.enable_ident_normalization",
    "datafusion.sql_parser.dialect",
    "datafusion.explain.format",
    "datafusion.explain.show_statistics",
    "datafusion.explain.show_schema",
    "datafusion.explain.show_sizes",
    "datafusion.explain.physical_plan_only",
    "datafusion.explain.logical_plan_only",
    "datafusion.format.null",
    "datafusion.format.date_format",
    "datafusion.format.datetime_format",
    "datafusion.format.timestamp_format",
    "datafusion.format.timestamp_tz_format",
    "datafusion.format.time_format",
    "datafusion.format.duration_format",
];

/// Largest `batch_size` a confined session may set (memory per batch).
const MAX_BATCH_SIZE: usize = 65_536;

/// A statement refused because the session is confined. Carried inside DataFusion errors
/// (`External`); Flight maps it to `PERMISSION_DENIED`, the audit log to its action.
#[derive(Debug, Clone, thiserror::Error)]
// Not non_exhaustive: Flight matches every variant, so a new one forces a gRPC code.
pub enum Refusal {
    /// Reading a file or object by path outside every area the principal may read.
    #[error(
        "principal '{principal}' may not read '{path}' by path: {reason} (policy [areas.NAME] read)"
    )]
    FileRead {
        /// The principal.
        principal: String,
        /// The path or URL as the statement named it.
        path: String,
        /// Why.
        reason: String,
    },
    /// Writing outside every area the principal may write.
    #[error("principal '{principal}' may not write '{path}': {reason} (policy [areas.NAME] write)")]
    FileWrite {
        /// The principal.
        principal: String,
        /// Target path or URL.
        path: String,
        /// Why.
        reason: String,
    },
    /// `SET` of an option that is not on the allow-list.
    #[error("option '{name}' cannot be set over {front}: {reason}")]
    Setting {
        /// Option name.
        name: String,
        /// `Flight SQL` or `a confined shell`.
        front: &'static str,
        /// Why (lists what may be set).
        reason: String,
    },
    /// A statement kind that a confined session may not run.
    #[error("{what} is not allowed over {front}: {reason}")]
    Statement {
        /// What was refused (`CREATE TABLE`, `INSERT`...).
        what: String,
        /// `Flight SQL` or `a confined shell`.
        front: &'static str,
        /// Why.
        reason: String,
    },
}

impl Refusal {
    /// The audit action of this refusal.
    pub fn action(&self) -> &'static str {
        match self {
            Refusal::FileRead { .. } => "read_file",
            Refusal::FileWrite { .. } => "write_file",
            Refusal::Setting { .. } => "set",
            Refusal::Statement { .. } => "statement",
        }
    }

    /// What the refusal is about (the audit record's `table` field).
    pub fn resource(&self) -> String {
        match self {
            Refusal::FileRead { path, .. } | Refusal::FileWrite { path, .. } => {
                format!("file:{path}")
            }
            Refusal::Setting { name, .. } => format!("option:{name}"),
            Refusal::Statement { what, .. } => format!("statement:{what}"),
        }
    }
}

/// The refusal inside a DataFusion error, if any.
pub fn refusal_of(e: &DataFusionError) -> Option<&Refusal> {
    crate::cause::cause_of(e)
}

/// One area, resolved: its canonical root, and the root as configured (absolute).
#[derive(Debug, Clone)]
struct Root {
    name: String,
    path: PathBuf,
    lexical: PathBuf,
}

/// What a confined principal may touch on the server's filesystem.
#[derive(Debug)]
pub struct Confinement {
    principal: String,
    front: &'static str,
    read: Vec<Root>,
    write: Vec<Root>,
}

impl Confinement {
    /// Areas of `policy` that `caller` may read and write; `roots` are the policy's
    /// areas with their canonical root directories (resolved once, when the engine opens).
    pub fn new(
        policy: &clearice_policy::Policy,
        roots: &[(clearice_policy::Area, PathBuf, PathBuf)],
        caller: &crate::Caller,
    ) -> Self {
        let principal = caller.principal();
        let front = caller.front().name();
        let pick = |may: &dyn Fn(&clearice_policy::Area) -> bool| -> Vec<Root> {
            roots
                .iter()
                .filter(|(a, _, _)| may(a))
                .map(|(a, p, l)| Root {
                    name: a.name.clone(),
                    path: p.clone(),
                    lexical: l.clone(),
                })
                .collect()
        };
        Self {
            principal: principal.to_owned(),
            front,
            read: pick(&|a| policy.may_read_area(a, principal)),
            write: pick(&|a| policy.may_write_area(a, principal)),
        }
    }

    /// Resolves the policy's area roots against `base` (the policy file's directory). An
    /// area whose root does not exist is left out (it grants nothing) with a warning.
    #[expect(
        clippy::disallowed_methods,
        reason = "startup; Engine::open calls it on a blocking thread"
    )]
    pub fn resolve_roots(
        policy: &clearice_policy::Policy,
        base: &Path,
    ) -> Vec<(clearice_policy::Area, PathBuf, PathBuf)> {
        policy
            .areas()
            .iter()
            .filter_map(|a| match std::fs::canonicalize(base.join(&a.root)) {
                Ok(p) => Some((a.clone(), p, lexical_normal(&base.join(&a.root)))),
                Err(e) => {
                    tracing::warn!(area = %a.name, root = %a.root, error = %e, "file area root cannot be resolved; it grants nothing");
                    None
                }
            })
            .collect()
    }

    fn read_refusal(&self, path: &str, reason: impl Into<String>) -> DataFusionError {
        DataFusionError::External(Box::new(Refusal::FileRead {
            principal: self.principal.clone(),
            path: path.to_owned(),
            reason: reason.into(),
        }))
    }

    fn write_refusal(&self, path: &str, reason: impl Into<String>) -> DataFusionError {
        DataFusionError::External(Box::new(Refusal::FileWrite {
            principal: self.principal.clone(),
            path: path.to_owned(),
            reason: reason.into(),
        }))
    }

    fn statement(&self, what: &str, reason: &str) -> DataFusionError {
        DataFusionError::External(Box::new(Refusal::Statement {
            what: what.to_owned(),
            front: self.front,
            reason: reason.to_owned(),
        }))
    }

    fn areas_text(roots: &[Root]) -> String {
        if roots.is_empty() {
            "it is granted no area".to_owned()
        } else {
            format!(
                "it is outside the areas granted to it ({})",
                roots
                    .iter()
                    .map(|r| r.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    }

    /// Checks that `url` (as the statement named it: `shown`) lies in a readable area.
    async fn check_read(self: &Arc<Self>, shown: &str, url: &ListingTableUrl) -> DfResult<()> {
        let Some(path) = local_path(url) else {
            return Err(self.read_refusal(
                shown,
                format!(
                    "'{}' URLs are not in any area (areas are local directories)",
                    url.scheme()
                ),
            ));
        };
        self.allows(path, false)
            .await?
            .map_err(|reason| self.read_refusal(shown, reason))
    }

    /// Checks that `output_url` of a `COPY` lies in a writable area.
    async fn check_write(self: &Arc<Self>, shown: &str) -> DfResult<()> {
        let url = ListingTableUrl::parse(shown)
            .map_err(|e| self.write_refusal(shown, format!("not a path or URL: {e}")))?;
        let Some(path) = local_path(&url) else {
            return Err(self.write_refusal(
                shown,
                format!("'{}' URLs are not in any area", url.scheme()),
            ));
        };
        self.allows(path, true)
            .await?
            .map_err(|reason| self.write_refusal(shown, reason))
    }

    /// Whether `path` lies in an area this principal may read (`write = false`) or write:
    /// `Ok(Err(reason))` when it does not. Outside every area as written it is refused
    /// without touching the filesystem (so a refusal does not tell whether the path
    /// exists); inside, it is resolved (symlinks, `..`) on a blocking thread.
    async fn allows(self: &Arc<Self>, path: PathBuf, write: bool) -> DfResult<Result<(), String>> {
        let roots = if write { &self.write } else { &self.read };
        if !lexically_inside(roots, &path) {
            return Ok(Err(Self::areas_text(roots)));
        }
        let me = Arc::clone(self);
        SpawnedTask::spawn_blocking(move || {
            let (roots, resolved) = if write {
                (&me.write, resolve_for_write(&path))
            } else {
                (&me.read, resolve(&path))
            };
            match resolved {
                Ok(p) if me.area_of(roots, &p).is_some() => Ok(()),
                Ok(_) => Err(Self::areas_text(roots)),
                Err(reason) => Err(reason),
            }
        })
        .join()
        .await
        .map_err(|e| DataFusionError::ExecutionJoin(Box::new(e)))
    }

    fn area_of<'a>(&self, roots: &'a [Root], canonical: &Path) -> Option<&'a str> {
        roots
            .iter()
            .find(|r| canonical.starts_with(&r.path))
            .map(|r| r.name.as_str())
    }

    /// Refuses what a confined session may not run in `plan` (all nodes, subqueries and
    /// the inputs of EXPLAIN included) and checks the paths it names.
    pub async fn check_plan(self: &Arc<Self>, plan: &LogicalPlan) -> DfResult<()> {
        let mut reads: Vec<ListingTableUrl> = Vec::new();
        let mut writes: Vec<String> = Vec::new();
        let mut refused: Option<DataFusionError> = None;
        plan.apply_with_subqueries(|node| {
            let verdict = match node {
                LogicalPlan::Ddl(DdlStatement::CreateExternalTable(c)) => {
                    match ListingTableUrl::parse(&c.location) {
                        Ok(u) => {
                            reads.push(u);
                            Ok(())
                        }
                        Err(e) => Err(self.read_refusal(&c.location, e.to_string())),
                    }
                }
                LogicalPlan::Ddl(d) => Err(self.statement(
                    d.name(),
                    "only Iceberg catalogs' schemas and tables can be created or dropped",
                )),
                // Writes to catalog tables follow the policy's write rules.
                LogicalPlan::Dml(d) if crate::write_rules::is_policy_target(&d.target) => Ok(()),
                LogicalPlan::Dml(d) => Err(self.statement(
                    &d.op.to_string(),
                    "only Iceberg catalog tables can be written",
                )),
                LogicalPlan::Copy(c) => {
                    writes.push(c.output_url.clone());
                    Ok(())
                }
                LogicalPlan::Statement(PlanStatement::SetVariable(s)) => {
                    self.check_setting(&s.variable, &s.value)
                }
                LogicalPlan::Statement(PlanStatement::ResetVariable(s)) => {
                    self.check_setting(&s.variable, "")
                }
                LogicalPlan::TableScan(scan) => {
                    if let Ok(p) = source_as_provider(&scan.source)
                        && let Some(l) = p.as_any().downcast_ref::<ListingTable>()
                    {
                        reads.extend(l.table_paths().iter().cloned());
                    }
                    Ok(())
                }
                _ => Ok(()),
            };
            match verdict {
                Ok(()) => Ok(TreeNodeRecursion::Continue),
                Err(e) => {
                    refused = Some(e);
                    Ok(TreeNodeRecursion::Stop)
                }
            }
        })?;
        if let Some(e) = refused {
            return Err(e);
        }
        for u in &reads {
            self.check_read(u.as_str(), u).await?;
        }
        for w in &writes {
            self.check_write(w).await?;
        }
        Ok(())
    }

    /// Refuses `SET name = value` unless the option is on the allow-list (and its value
    /// within bounds) for a confined session.
    pub fn check_setting(&self, name: &str, value: &str) -> DfResult<()> {
        let lower = name.to_ascii_lowercase();
        let refuse = |reason: String| {
            Err(DataFusionError::External(Box::new(Refusal::Setting {
                name: name.to_owned(),
                front: self.front,
                reason,
            })))
        };
        if !SETTABLE_OPTIONS.contains(&lower.as_str()) {
            return refuse(format!(
                "only these options may be set: {}",
                SETTABLE_OPTIONS.join(", ")
            ));
        }
        if lower == "datafusion.execution.batch_size"
            && !value.is_empty()
            && value
                .trim()
                .parse::<usize>()
                .map_or(true, |n| n == 0 || n > MAX_BATCH_SIZE)
        {
            return refuse(format!("batch_size must be 1..={MAX_BATCH_SIZE}"));
        }
        Ok(())
    }

    /// The object store a confined session sees under `file://`.
    pub fn store(self: &Arc<Self>) -> Arc<dyn ObjectStore> {
        Arc::new(AreaStore {
            inner: LocalFileSystem::new(),
            guard: Arc::clone(self),
        })
    }
}

/// `path` with `.` and `..` removed without looking at the filesystem.
fn lexical_normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Whether `path`, as written, lies under one of `roots` (canonical or as configured).
fn lexically_inside(roots: &[Root], path: &Path) -> bool {
    let p = lexical_normal(path);
    roots
        .iter()
        .any(|r| p.starts_with(&r.path) || p.starts_with(&r.lexical))
}

/// The local path of a `file://` listing URL (its prefix, before any glob).
fn local_path(url: &ListingTableUrl) -> Option<PathBuf> {
    if url.scheme() != "file" {
        return None;
    }
    Some(PathBuf::from(format!("/{}", url.prefix().as_ref())))
}

/// Canonical path of an existing file or directory (symlinks and `..` resolved).
/// Blocking: only called on blocking threads.
#[expect(clippy::disallowed_methods, reason = "only called on blocking threads")]
fn resolve(path: &Path) -> Result<PathBuf, String> {
    std::fs::canonicalize(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => "no such file or directory".to_owned(),
        _ => format!("cannot resolve it: {e}"),
    })
}

/// Canonical path a write to `path` would create: the deepest existing ancestor resolved,
/// the rest appended (plain names only). An existing target is resolved itself (a symlink
/// pointing out of the area is outside it).
#[expect(clippy::disallowed_methods, reason = "only called on blocking threads")]
fn resolve_for_write(path: &Path) -> Result<PathBuf, String> {
    if let Ok(p) = std::fs::canonicalize(path) {
        return Ok(p);
    }
    let mut rest = Vec::new();
    let mut cur = path.to_path_buf();
    loop {
        if let Ok(p) = std::fs::canonicalize(&cur) {
            let mut out = p;
            for c in rest.iter().rev() {
                out.push(c);
            }
            return Ok(out);
        }
        if std::fs::symlink_metadata(&cur).is_ok() {
            return Err("it is a dangling symbolic link".to_owned());
        }
        match (cur.file_name(), cur.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name.to_owned());
                cur = parent.to_path_buf();
            }
            _ => return Err("cannot resolve it".to_owned()),
        }
        if cur.components().any(|c| matches!(c, Component::ParentDir)) {
            return Err("'..' in a path that does not exist yet".to_owned());
        }
    }
}

/// URL tables (`SELECT * FROM 'path'`): in a confined session only paths inside a
/// readable area. Unlike DataFusion's factory, a path that cannot be opened (missing,
/// unreadable, an S3 error) says why instead of "table not found".
#[derive(Debug)]
pub struct ConfinedUrlTableFactory {
    guard: Option<Arc<Confinement>>,
    state: OnceLock<Weak<RwLock<SessionState>>>,
}

impl ConfinedUrlTableFactory {
    /// `guard`: the session's confinement (`None`: the machine's own user).
    pub fn new(guard: Option<Arc<Confinement>>) -> Self {
        Self {
            guard,
            state: OnceLock::new(),
        }
    }

    /// The session whose state the factory reads files with (set once it exists).
    pub fn set_state(&self, state: Weak<RwLock<SessionState>>) {
        let _ = self.state.set(state);
    }
}

/// Whether a table name is meant as a path or URL (not a plain table name that simply
/// does not exist: those must read as "not found", also for hidden tables).
fn looks_like_path(name: &str) -> bool {
    const EXTENSIONS: [&str; 8] = [
        ".csv", ".tsv", ".json", ".ndjson", ".parquet", ".avro", ".arrow", ".ipc",
    ];
    let lower = name.to_ascii_lowercase();
    name.contains('/')
        || name.contains('\\')
        || name.contains(':')
        || EXTENSIONS.iter().any(|e| lower.contains(e))
}

#[async_trait]
impl UrlTableFactory for ConfinedUrlTableFactory {
    async fn try_new(&self, url: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        if !looks_like_path(url) {
            return Ok(None);
        }
        let table_url = match &self.guard {
            Some(guard) => {
                let table_url = ListingTableUrl::parse(url)
                    .map_err(|e| guard.read_refusal(url, format!("not a path or URL: {e}")))?;
                guard.check_read(url, &table_url).await?;
                table_url
            }
            None => match ListingTableUrl::parse(url) {
                Ok(u) => u,
                Err(_) => return Ok(None),
            },
        };
        let state = self
            .state
            .get()
            .and_then(Weak::upgrade)
            .map(|s| s.read().clone())
            .ok_or_else(|| DataFusionError::Internal("confined session state is gone".into()))?;
        match ListingTableConfig::new(table_url.clone())
            .infer_options(&state)
            .await
        {
            Ok(cfg) => {
                let cfg = cfg
                    .infer_partitions_from_path(&state)
                    .await?
                    .infer_schema(&state)
                    .await?;
                ListingTable::try_new(cfg).map(|t| Some(Arc::new(t) as Arc<dyn TableProvider>))
            }
            // A plain file name that is not there reads as "not found"; anything else
            // (an object store's error, a URL) says what went wrong.
            Err(e) if url.contains("://") => {
                // Nothing there at all (DataFusion reports an empty listing as an internal
                // error): say so.
                if let Ok(store) = state.runtime_env().object_store(table_url.object_store())
                    && let Ok(None) = store
                        .list(Some(table_url.prefix()))
                        .next()
                        .await
                        .transpose()
                {
                    return Err(DataFusionError::External(Box::new(UnreadableUrl {
                        url: url.to_owned(),
                        reason: "no object at or under this URL".into(),
                        missing: true,
                    })));
                }
                // The causes too: an HTTP client's "error sending request" alone hides
                // the refused certificate or connection behind it.
                let mut reason = crate::cause::one_line(&e);
                let mut cause = std::error::Error::source(&e);
                while let Some(c) = cause {
                    let text = c.to_string();
                    if !reason.contains(&text) {
                        reason = format!("{reason}: {text}");
                    }
                    cause = c.source();
                }
                let missing = matches!(
                    e.find_root(),
                    DataFusionError::ObjectStore(o) if matches!(**o, object_store::Error::NotFound { .. })
                );
                Err(DataFusionError::External(Box::new(UnreadableUrl {
                    url: url.to_owned(),
                    reason: reason.replace('\n', " "),
                    missing,
                })))
            }
            Err(_) => Ok(None),
        }
    }
}

/// A URL in FROM (`'s3://bucket/f.parquet'`) that cannot be read: its object is missing,
/// or the store refused or could not be reached (the reason carries the cause chain).
#[derive(Debug, Clone, thiserror::Error)]
#[error("'{url}' cannot be read: {reason}")]
pub struct UnreadableUrl {
    /// The URL as written.
    pub url: String,
    /// Why, with the causes.
    pub reason: String,
    /// The object (or bucket) does not exist.
    pub missing: bool,
}

/// `file://` of a confined session: reads only inside readable areas, writes only inside
/// writable ones, resolved again at every access; no delete, copy or rename.
#[derive(Debug)]
struct AreaStore {
    inner: LocalFileSystem,
    guard: Arc<Confinement>,
}

impl fmt::Display for AreaStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AreaStore({})", self.guard.principal)
    }
}

fn store_error(path: &ObjectPath, reason: String) -> object_store::Error {
    object_store::Error::PermissionDenied {
        path: path.to_string(),
        source: reason.into(),
    }
}

impl AreaStore {
    async fn allow(&self, location: &ObjectPath, write: bool) -> object_store::Result<()> {
        let fs_path = PathBuf::from(format!("/{location}"));
        let verdict = self
            .guard
            .allows(fs_path, write)
            .await
            .map_err(|e| store_error(location, e.to_string()))?;
        verdict.map_err(|reason| {
            let verb = if write { "write" } else { "read" };
            store_error(
                location,
                format!(
                    "principal '{}' may not {verb} it: {reason}",
                    self.guard.principal
                ),
            )
        })
    }
}

#[async_trait]
impl ObjectStore for AreaStore {
    async fn put_opts(
        &self,
        location: &ObjectPath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.allow(location, true).await?;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &ObjectPath,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.allow(location, true).await?;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &ObjectPath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.allow(location, false).await?;
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(
        &self,
        location: &ObjectPath,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<bytes::Bytes>> {
        self.allow(location, false).await?;
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<ObjectPath>>,
    ) -> BoxStream<'static, object_store::Result<ObjectPath>> {
        locations
            .map(|l| {
                l.and_then(|p| Err(store_error(&p, "confined sessions delete nothing".into())))
            })
            .boxed()
    }

    fn list(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let guard = Arc::clone(&self.guard);
        // Only entries whose resolved path is inside a readable area (a symlink in an
        // area that points out of it is not listed).
        self.inner
            .list(prefix)
            .filter_map(move |m| {
                let guard = Arc::clone(&guard);
                async move {
                    match m {
                        Ok(meta) => {
                            let p = PathBuf::from(format!("/{}", meta.location));
                            let ok = SpawnedTask::spawn_blocking(move || {
                                resolve(&p)
                                    .ok()
                                    .is_some_and(|c| guard.area_of(&guard.read, &c).is_some())
                            })
                            .join()
                            .await
                            .unwrap_or(false);
                            ok.then_some(Ok(meta))
                        }
                        Err(e) => Some(Err(e)),
                    }
                }
            })
            .boxed()
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> object_store::Result<ListResult> {
        if let Some(p) = prefix {
            self.allow(p, false).await?;
        } else {
            return Err(store_error(
                &ObjectPath::from("/"),
                "confined sessions do not list the filesystem root".into(),
            ));
        }
        let mut listed = self.inner.list_with_delimiter(prefix).await?;
        let mut kept = Vec::new();
        for o in listed.objects {
            if self.allow(&o.location, false).await.is_ok() {
                kept.push(o);
            }
        }
        listed.objects = kept;
        Ok(listed)
    }

    async fn copy_opts(
        &self,
        from: &ObjectPath,
        _to: &ObjectPath,
        _options: CopyOptions,
    ) -> object_store::Result<()> {
        Err(store_error(from, "confined sessions copy nothing".into()))
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests may block")]
mod tests {
    use super::*;

    #[test]
    fn plain_names_are_not_paths() {
        assert!(!looks_like_path("customers"));
        assert!(looks_like_path("/srv/x"));
        assert!(looks_like_path("data.csv"));
        assert!(looks_like_path("s3://b/k"));
        assert!(looks_like_path("..\\x"));
    }

    #[test]
    fn write_target_resolves_through_existing_ancestors() {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        let p = resolve_for_write(&root.join("a/b/c.csv")).unwrap();
        assert_eq!(p, root.join("a/b/c.csv"));
        std::os::unix::fs::symlink("/etc", root.join("out")).unwrap();
        let p = resolve_for_write(&root.join("out/new.csv")).unwrap();
        assert_eq!(p, Path::new("/etc/new.csv"));
        std::os::unix::fs::symlink(root.join("missing"), root.join("dangling")).unwrap();
        assert!(resolve_for_write(&root.join("dangling")).is_err());
    }
}
