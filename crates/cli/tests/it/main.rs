//! The real `clearice` binary, one test binary: the shell and `-c`/`-f` (`cli`), SQL writes
//! as pipelines run them (`writes`), `clearice serve` with ADBC, JDBC and the attack suite
//! (`flight`), the policy against DuckDB (`policy_differential`), a Ranger
//! export imported onto the demo lake (`ranger`), the remote provider and
//! crypto service (`remote`), AWS KMS on moto (`aws_kms`), workers as processes
//! (`cluster`), DataFusion's own sqllogictest suite (`datafusion_slt`), a dbt project
//! through the dbt-clearice adapter (`dbt`), Prometheus scraping (`metrics`), and Superset
//! through the clearice-sqlalchemy dialect (`superset`).
#![allow(clippy::unwrap_used, reason = "tests: a panic is how a test fails")]
// Tests may block: they are not async workers serving anyone.
#![allow(clippy::disallowed_methods)]

mod aws_kms;
mod cli;
mod cluster;
mod common;
mod datafusion_slt;
mod dbt;
mod flight;
mod metrics;
mod policy_differential;
mod ranger;
mod remote;
mod superset;
mod writes;
