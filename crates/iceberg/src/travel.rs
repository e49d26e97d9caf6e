//! Time travel: a table read as of a snapshot, and metadata table names.
//!
//! [`crate::sql`] parses the clauses into sqlparser's typed [`TableVersion`] on the table
//! factor; the planner opens those tables before planning ([`versioned_tables`] lists
//! them, [`as_of`] reads each clause) and [`TravelPlanner`], a DataFusion
//! `RelationPlanner`, plans each as a scan of the table it opened:
//!
//! ```text
//!  FROM t FOR VERSION AS OF 123     ─▶ TableVersion::VersionAsOf(123)   ─▶ AsOf::Version
//!  FROM t VERSION AS OF 'audit'     ─▶ TableVersion::VersionAsOf('audit') ─▶ AsOf::Ref
//!  FROM t FOR TIMESTAMP AS OF …     ─▶ TableVersion::TimestampAsOf(…)  ─▶ AsOf::Timestamp
//!        ─▶ TravelPlanner: TableScan(t, the table opened as of that snapshot)
//! ```
//!
//! Metadata tables are named like Trino's: `"t$snapshots"`, `"t$history"`,
//! `"t$manifests"`, `"t$files"`, `"t$partitions"`, `"t$refs"`.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::Arc;

use datafusion::catalog::TableProvider;
use datafusion::common::TableReference;
use datafusion::datasource::provider_as_source;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::LogicalPlanBuilder;
use datafusion::logical_expr::planner::{
    PlannedRelation, RelationPlanner, RelationPlannerContext, RelationPlanning,
};
use datafusion::sql::parser::Statement;
use datafusion::sql::sqlparser::ast::{
    Expr, ObjectName, TableFactor, TableVersion, Value, Visit, Visitor,
};

/// A snapshot named by a query (`FOR VERSION AS OF`, `FOR TIMESTAMP AS OF`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AsOf {
    /// A snapshot id.
    Version(i64),
    /// A branch or tag name.
    Ref(String),
    /// The snapshot current at this time (milliseconds since the epoch, UTC).
    Timestamp(i64),
}

impl std::fmt::Display for AsOf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Version(v) => write!(f, "version {v}"),
            Self::Ref(r) => write!(f, "ref '{r}'"),
            Self::Timestamp(ms) => write!(f, "timestamp {}", format_ms(*ms)),
        }
    }
}

/// The table's branches and tags (iceberg 0.10.1 has no accessor: read from the
/// metadata's own serialization).
pub(crate) fn refs_of(
    m: &iceberg::spec::TableMetadata,
) -> BTreeMap<String, iceberg::spec::SnapshotReference> {
    serde_json::to_value(m)
        .ok()
        .and_then(|v| serde_json::from_value(v.get("refs")?.clone()).ok())
        .unwrap_or_default()
}

/// `a, b, c`, or `none`.
pub(crate) fn listing(items: impl Iterator<Item = String>) -> String {
    let v: Vec<String> = items.collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// `2024-01-02 03:04:05.678 UTC` for milliseconds since the epoch.
pub(crate) fn format_ms(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string())
        .unwrap_or_else(|| ms.to_string())
}

/// A metadata table of an Iceberg table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetadataTable {
    /// `$snapshots`: every snapshot with its operation and summary.
    Snapshots,
    /// `$history`: when each snapshot became current.
    History,
    /// `$manifests`: the current snapshot's manifests.
    Manifests,
    /// `$files`: the current snapshot's data and delete files.
    Files,
    /// `$partitions`: files and rows per partition.
    Partitions,
    /// `$refs`: branches and tags.
    Refs,
}

impl MetadataTable {
    /// The suffix naming it (`files` for `"t$files"`).
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, k)| *k == self)
            .map_or("", |(s, _)| s)
    }

    /// Every metadata table, with its suffix.
    pub const ALL: [(&'static str, MetadataTable); 6] = [
        ("snapshots", Self::Snapshots),
        ("history", Self::History),
        ("manifests", Self::Manifests),
        ("files", Self::Files),
        ("partitions", Self::Partitions),
        ("refs", Self::Refs),
    ];
}

fn metadata_of(name: &str) -> Option<(&str, MetadataTable)> {
    let (base, suffix) = name.rsplit_once('$')?;
    let (_, kind) = MetadataTable::ALL.iter().find(|(s, _)| *s == suffix)?;
    Some((base, *kind))
}

/// Splits `t$files` into the table name and the metadata table it names. A name whose
/// suffix is not one of ours is taken as a plain table name.
pub fn split_name(name: &str) -> (&str, Option<MetadataTable>) {
    match metadata_of(name) {
        Some((base, kind)) => (base, Some(kind)),
        None => (name, None),
    }
}

/// The snapshot a table version clause names. Snowflake's `AT(...)`/`BEFORE(...)` and
/// values other than literals are refused.
pub fn as_of(version: &TableVersion) -> Result<AsOf> {
    let literal = |e: &Expr| match e {
        Expr::Value(v) => Some(v.value.clone()),
        Expr::TypedString(t) => Some(t.value.value.clone()),
        _ => None,
    };
    match version {
        TableVersion::VersionAsOf(e) => match literal(e) {
            Some(Value::Number(n, _)) => n
                .parse()
                .map(AsOf::Version)
                .map_err(|_| plan(&format!("'{n}' is not a snapshot id"))),
            Some(Value::SingleQuotedString(r)) if !r.is_empty() => Ok(AsOf::Ref(r)),
            _ => Err(plan(&format!(
                "VERSION AS OF needs a snapshot id or a branch or tag name, not {e}"
            ))),
        },
        TableVersion::TimestampAsOf(e) | TableVersion::ForSystemTimeAsOf(e) => match literal(e) {
            Some(Value::Number(n, _)) => {
                let secs: i64 = n.parse().map_err(|_| {
                    plan(&format!("'{n}' is not a number of seconds since the epoch"))
                })?;
                Ok(AsOf::Timestamp(secs.saturating_mul(1000)))
            }
            Some(Value::SingleQuotedString(t)) => parse_timestamp_ms(&t).map(AsOf::Timestamp),
            _ => Err(plan(&format!(
                "TIMESTAMP AS OF needs a literal such as TIMESTAMP '2024-01-01 00:00:00', not {e}"
            ))),
        },
        TableVersion::Function(f) => Err(DataFusionError::NotImplemented(format!(
            "time travel with {f} is not supported (use FOR VERSION AS OF or FOR TIMESTAMP AS OF)"
        ))),
    }
}

/// The tables a statement reads as of a snapshot, with their clauses (subqueries,
/// EXPLAIN, COPY and PREPARE included).
pub fn versioned_tables(stmt: &Statement) -> Vec<(ObjectName, TableVersion)> {
    struct Versions(Vec<(ObjectName, TableVersion)>);
    impl Visitor for Versions {
        type Break = ();
        fn pre_visit_table_factor(&mut self, f: &TableFactor) -> ControlFlow<()> {
            if let TableFactor::Table {
                name,
                version: Some(v),
                ..
            } = f
            {
                self.0.push((name.clone(), v.clone()));
            }
            ControlFlow::Continue(())
        }
    }
    fn walk(stmt: &Statement, v: &mut Versions) {
        match stmt {
            Statement::Statement(s) => {
                let _ = s.visit(v);
            }
            Statement::Explain(e) => walk(&e.statement, v),
            Statement::CopyTo(c) => {
                if let datafusion::sql::parser::CopyToSource::Query(q) = &c.source {
                    let _ = q.visit(v);
                }
            }
            Statement::CreateExternalTable(_) | Statement::Reset(_) => {}
        }
    }
    let mut v = Versions(Vec::new());
    walk(stmt, &mut v);
    v.0
}

/// Plans a table read as of a snapshot as a scan of the table opened so, before planning
/// (opening a table is async; planning is not). A versioned table it was not given is an
/// error, so a session registers an empty one: DataFusion's own planner would read the
/// current table and ignore the clause.
#[derive(Debug, Default)]
pub struct TravelPlanner {
    tables: Vec<(TableReference, AsOf, Arc<dyn TableProvider>)>,
}

impl TravelPlanner {
    /// Adds `reference` as of `as_of`, opened as `provider`.
    pub fn add(
        &mut self,
        reference: TableReference,
        as_of: AsOf,
        provider: Arc<dyn TableProvider>,
    ) {
        self.tables.push((reference, as_of, provider));
    }
}

impl RelationPlanner for TravelPlanner {
    fn plan_relation(
        &self,
        relation: TableFactor,
        context: &mut dyn RelationPlannerContext,
    ) -> Result<RelationPlanning> {
        let TableFactor::Table {
            name,
            alias,
            args,
            with_hints,
            version: Some(version),
            with_ordinality,
            partitions,
            json_path,
            sample,
            index_hints,
        } = relation
        else {
            return Ok(RelationPlanning::Original(Box::new(relation)));
        };
        if args.is_some()
            || !with_hints.is_empty()
            || with_ordinality
            || !partitions.is_empty()
            || json_path.is_some()
            || sample.is_some()
            || !index_hints.is_empty()
        {
            return Err(DataFusionError::NotImplemented(format!(
                "time travel on '{name}' with table arguments, hints, partitions or TABLESAMPLE is not supported"
            )));
        }
        let as_of = as_of(&version)?;
        let reference = context.object_name_to_table_reference(name.clone())?;
        let Some((_, _, provider)) = self
            .tables
            .iter()
            .find(|(r, a, _)| *r == reference && *a == as_of)
        else {
            return Err(plan(&format!(
                "time travel on '{name}' ({version}) cannot be planned here (the table was not opened as of that snapshot)"
            )));
        };
        let plan =
            LogicalPlanBuilder::scan(reference, provider_as_source(Arc::clone(provider)), None)?
                .build()?;
        Ok(RelationPlanning::Planned(Box::new(PlannedRelation::new(
            plan, alias,
        ))))
    }
}

fn plan(msg: &str) -> DataFusionError {
    DataFusionError::Plan(msg.to_owned())
}

/// Milliseconds since the epoch of a timestamp literal: RFC 3339, or
/// `YYYY-MM-DD[ HH:MM:SS[.fff]]` taken as UTC.
pub fn parse_timestamp_ms(text: &str) -> Result<i64> {
    let t = text.trim();
    if let Ok(dt) = chrono::DateTime::parse_from_rfc3339(t) {
        return Ok(dt.timestamp_millis());
    }
    for f in [
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%d %H:%M",
    ] {
        if let Ok(dt) = chrono::NaiveDateTime::parse_from_str(t, f) {
            return Ok(dt.and_utc().timestamp_millis());
        }
    }
    for f in ["%Y-%m-%d %H:%M:%S%.f%:z", "%Y-%m-%d %H:%M:%S%.f %Z"] {
        if let Ok(dt) = chrono::DateTime::parse_from_str(t, f) {
            return Ok(dt.timestamp_millis());
        }
    }
    if let Ok(d) = chrono::NaiveDate::parse_from_str(t, "%Y-%m-%d") {
        return Ok(d
            .and_hms_opt(0, 0, 0)
            .expect("midnight")
            .and_utc()
            .timestamp_millis());
    }
    Err(plan(&format!(
        "cannot read time travel timestamp '{text}' (use 'YYYY-MM-DD HH:MM:SS[.fff]' in UTC, or RFC 3339)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_names_split() {
        assert_eq!(split_name("t$files"), ("t", Some(MetadataTable::Files)));
        assert_eq!(split_name("t$other"), ("t$other", None));
        assert_eq!(split_name("plain"), ("plain", None));
        assert_eq!(split_name("t@version=1"), ("t@version=1", None));
    }

    #[test]
    fn clauses_read_as_snapshots() {
        let n = |s: &str| Expr::value(Value::Number(s.into(), false));
        let q = |s: &str| Expr::value(Value::SingleQuotedString(s.into()));
        assert_eq!(
            as_of(&TableVersion::VersionAsOf(n("5"))).unwrap(),
            AsOf::Version(5)
        );
        assert_eq!(
            as_of(&TableVersion::VersionAsOf(q("a@b"))).unwrap(),
            AsOf::Ref("a@b".into())
        );
        assert_eq!(
            as_of(&TableVersion::ForSystemTimeAsOf(q("2024-01-01T00:00:00Z"))).unwrap(),
            AsOf::Timestamp(1_704_067_200_000)
        );
        assert!(as_of(&TableVersion::VersionAsOf(q(""))).is_err());
        assert!(as_of(&TableVersion::VersionAsOf(n("1.5"))).is_err());
        let e = as_of(&TableVersion::TimestampAsOf(q("yesterday"))).unwrap_err();
        assert!(
            e.to_string()
                .contains("cannot read time travel timestamp 'yesterday'"),
            "{e}"
        );
    }
}
