//! Every kind of statement DataFusion plans, and the path the gate sends it down.
//!
//! [`route`] matches every `LogicalPlan`, `Statement`, `DdlStatement` and `WriteOp`
//! variant without a wildcard: a DataFusion upgrade that adds a statement kind does not
//! compile until someone decides here how the gate handles it. MERGE and ALTER TABLE of
//! catalog tables never reach a `LogicalPlan` (DataFusion does not plan them): the session
//! routes them from the parsed statement.

use datafusion::logical_expr::{DdlStatement, LogicalPlan, Statement, WriteOp};

/// What the gate does with a planned statement (after the confinement check and the
/// policy's write checks of `clearice_access::write_rules::check_statement`, which see every node,
/// subqueries and the plan inside `PREPARE`/`EXPLAIN` included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// A read: scans of catalog tables go through the policy's table providers.
    Query,
    /// INSERT, CREATE TABLE AS, COPY: the copy checks ran; catalog tables write through
    /// the policy's write target.
    Write,
    /// DELETE, UPDATE (and TRUNCATE): planned by `clearice_access::row_level` from the
    /// statement as written; never by DataFusion's DML planner.
    RowLevel,
    /// DDL: catalog changes run through `clearice_iceberg::ddl` (write rules, audited);
    /// others are DataFusion's, limited by the confinement.
    Ddl,
    /// Session statements: SET/RESET (kept for front ends), transactions (no-ops),
    /// `PREPARE` (its plan was checked like the statement itself), `EXECUTE` (runs a plan
    /// checked when prepared; row-level writes are refused there) and `DEALLOCATE`.
    Session,
}

/// The route of `plan` (see [`Route`]).
pub(crate) fn route(plan: &LogicalPlan) -> Route {
    match plan {
        LogicalPlan::Projection(_)
        | LogicalPlan::Filter(_)
        | LogicalPlan::Window(_)
        | LogicalPlan::Aggregate(_)
        | LogicalPlan::Sort(_)
        | LogicalPlan::Join(_)
        | LogicalPlan::Repartition(_)
        | LogicalPlan::Union(_)
        | LogicalPlan::TableScan(_)
        | LogicalPlan::EmptyRelation(_)
        | LogicalPlan::Subquery(_)
        | LogicalPlan::SubqueryAlias(_)
        | LogicalPlan::Limit(_)
        | LogicalPlan::Values(_)
        | LogicalPlan::Extension(_)
        | LogicalPlan::Distinct(_)
        | LogicalPlan::Unnest(_)
        | LogicalPlan::RecursiveQuery(_)
        | LogicalPlan::DescribeTable(_) => Route::Query,
        // EXPLAIN ANALYZE runs what it explains.
        LogicalPlan::Explain(e) => route(&e.plan),
        LogicalPlan::Analyze(a) => route(&a.input),
        LogicalPlan::Copy(_) => Route::Write,
        LogicalPlan::Dml(d) => match d.op {
            WriteOp::Insert(_) | WriteOp::Ctas => Route::Write,
            WriteOp::Delete | WriteOp::Update | WriteOp::Truncate => Route::RowLevel,
        },
        LogicalPlan::Ddl(d) => match d {
            DdlStatement::CreateExternalTable(_)
            | DdlStatement::CreateMemoryTable(_)
            | DdlStatement::CreateView(_)
            | DdlStatement::CreateCatalogSchema(_)
            | DdlStatement::CreateCatalog(_)
            | DdlStatement::CreateIndex(_)
            | DdlStatement::DropTable(_)
            | DdlStatement::DropView(_)
            | DdlStatement::DropCatalogSchema(_)
            | DdlStatement::CreateFunction(_)
            | DdlStatement::DropFunction(_) => Route::Ddl,
        },
        LogicalPlan::Statement(s) => match s {
            Statement::TransactionStart(_)
            | Statement::TransactionEnd(_)
            | Statement::SetVariable(_)
            | Statement::ResetVariable(_)
            | Statement::Prepare(_)
            | Statement::Execute(_)
            | Statement::Deallocate(_) => Route::Session,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One statement of each kind DataFusion plans, planned for real, with its route.
    #[tokio::test]
    async fn every_statement_kind_has_its_route() {
        let ctx = datafusion::prelude::SessionContext::new();
        ctx.sql("CREATE TABLE t (id BIGINT, v VARCHAR) AS VALUES (1, 'a')")
            .await
            .unwrap();
        let cases = [
            (
                "SELECT * FROM t WHERE id > 0 ORDER BY id LIMIT 1",
                Route::Query,
            ),
            ("SELECT DISTINCT v FROM t", Route::Query),
            ("SELECT v, count(*) OVER () FROM t", Route::Query),
            ("SELECT * FROM t a JOIN t b ON a.id = b.id", Route::Query),
            ("SELECT id FROM t UNION SELECT id FROM t", Route::Query),
            ("SELECT unnest([1, 2])", Route::Query),
            (
                "WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT * FROM r",
                Route::Query,
            ),
            ("VALUES (1)", Route::Query),
            ("DESCRIBE t", Route::Query),
            ("EXPLAIN SELECT * FROM t", Route::Query),
            (
                "EXPLAIN ANALYZE INSERT INTO t VALUES (2, 'b')",
                Route::Write,
            ),
            ("INSERT INTO t VALUES (2, 'b')", Route::Write),
            ("COPY t TO '/tmp/x.csv'", Route::Write),
            ("DELETE FROM t WHERE id = 1", Route::RowLevel),
            ("UPDATE t SET v = 'c' WHERE id = 1", Route::RowLevel),
            ("TRUNCATE TABLE t", Route::RowLevel),
            ("EXPLAIN DELETE FROM t", Route::RowLevel),
            ("CREATE TABLE u (id INT)", Route::Ddl),
            ("CREATE TABLE w AS SELECT 1", Route::Ddl),
            ("CREATE VIEW vv AS SELECT 1", Route::Ddl),
            ("CREATE SCHEMA s", Route::Ddl),
            ("DROP TABLE t", Route::Ddl),
            ("DROP VIEW IF EXISTS vv", Route::Ddl),
            ("DROP SCHEMA IF EXISTS s", Route::Ddl),
            ("SET datafusion.execution.batch_size = 10", Route::Session),
            ("RESET datafusion.execution.batch_size", Route::Session),
            ("START TRANSACTION", Route::Session),
            ("COMMIT", Route::Session),
            (
                "PREPARE p(BIGINT) AS SELECT * FROM t WHERE id = $1",
                Route::Session,
            ),
            ("EXECUTE p(1)", Route::Session),
            ("DEALLOCATE p", Route::Session),
        ];
        for (sql, want) in cases {
            let state = ctx.state();
            let plan = state
                .create_logical_plan(sql)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            assert_eq!(route(&plan), want, "{sql}");
        }
    }
}
