//! The column decision matrix: every policy decision (plaintext, masks, hide, deny) on
//! every column type of `lake.sales.customers`, checked against the plaintext a second
//! principal reads. Run over any lake whose table has those columns and keys (the demo
//! lake, written by ClearIce; the interop lake, written by PyArrow and PyIceberg) and any
//! way of opening a session under a policy ([`Lake`]).

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use sha2::{Digest, Sha256};

/// A column's type class, for what a mask must give.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    /// Text.
    String,
    /// Decimal.
    Decimal,
    /// Date.
    Date,
    /// Timestamp.
    Timestamp,
    /// A list.
    Nested,
}

/// The matrix's columns.
pub const COLUMNS: [(&str, Kind); 5] = [
    ("ssn", Kind::String),
    ("balance", Kind::Decimal),
    ("birth_date", Kind::Date),
    ("signup_ts", Kind::Timestamp),
    ("tags", Kind::Nested),
];

/// Every decision the matrix checks.
pub const DECISIONS: [&str; 10] = [
    "plaintext",
    "null",
    "fixed",
    "show_last_4",
    "show_first_4",
    "sha256",
    "truncate_to_year",
    "truncate_to_month",
    "hide",
    "deny",
];

/// Constant masks on the `pii_key` columns for role `a` (null, fixed, hide), plaintext
/// `balance`; `root` (role `admin`) reads everything.
pub const NULL_PII: &str = r#"
[roles]
a = {}
admin = {}
[users]
ua = { roles = ["a"] }
root = { roles = ["admin"] }
[tables."lake.sales.customers".columns.ssn]
master_key = "pii_key"
access = { a = "null", admin = "plaintext" }
[tables."lake.sales.customers".columns.email]
master_key = "pii_key"
access = { a = "fixed", admin = "plaintext" }
[tables."lake.sales.customers".columns.phone]
master_key = "pii_key"
access = { a = "hide", admin = "plaintext" }
[tables."lake.sales.customers".columns.balance]
master_key = "finance_key"
access = { a = "plaintext", admin = "plaintext" }
"#;

const PROTECTION: &str = r#"
[tables."lake.sales.customers".columns.ssn]
master_key = "pii_key"
ACCESS_ssn
[tables."lake.sales.customers".columns.email]
master_key = "pii_key"
access = { a = "plaintext", b = "plaintext" }
[tables."lake.sales.customers".columns.phone]
master_key = "pii_key"
access = { a = "plaintext", b = "plaintext" }
[tables."lake.sales.customers".columns.balance]
master_key = "finance_key"
ACCESS_balance
[tables."lake.sales.customers".columns.birth_date]
ACCESS_birth_date
[tables."lake.sales.customers".columns.signup_ts]
ACCESS_signup_ts
[tables."lake.sales.customers".columns.tags]
ACCESS_tags
"#;

fn applies(decision: &str, kind: Kind) -> bool {
    match decision {
        "show_last_4" | "show_first_4" => kind == Kind::String,
        "truncate_to_year" | "truncate_to_month" => matches!(kind, Kind::Date | Kind::Timestamp),
        _ => true,
    }
}

/// A policy where role `a` gets `decision` on every column it applies to and role `b`
/// sees plaintext; users `ua` and `ub`.
pub fn matrix_policy(decision: &str) -> String {
    let mut p = String::from(
        "[roles]\na = {}\nb = {}\n[users]\nua = { roles = [\"a\"] }\nub = { roles = [\"b\"] }\n",
    );
    let mut t = PROTECTION.to_owned();
    for (col, kind) in COLUMNS {
        let a = if applies(decision, kind) {
            format!("a = \"{decision}\", ")
        } else {
            String::new()
        };
        t = t.replace(
            &format!("ACCESS_{col}\n"),
            &format!("access = {{ {a}b = \"plaintext\" }}\n"),
        );
    }
    p.push_str(&t);
    p
}

/// One principal's way to run SQL.
#[allow(async_fn_in_trait, reason = "test support, run on one runtime")]
pub trait Principal {
    /// Runs `sql`, collecting its batches; the error as its message.
    async fn query(&self, sql: &str) -> Result<Vec<RecordBatch>, String>;
}

/// A lake sessions open on under a policy.
#[allow(async_fn_in_trait, reason = "test support, run on one runtime")]
pub trait Lake {
    /// A principal's session.
    type Session: Principal;
    /// Sessions of `ua` and `ub` under `policy` (`name`: a directory name for its files).
    async fn open(&self, policy: &str, name: &str) -> (Self::Session, Self::Session);
}

/// Runs the whole matrix over `table` of `lake`.
pub async fn run_matrix(lake: &impl Lake, table: &str) {
    for decision in DECISIONS {
        let (a, b) = lake.open(&matrix_policy(decision), decision).await;
        for (col, kind) in COLUMNS {
            let sql = format!("SELECT id, {col} FROM {table} ORDER BY id LIMIT 500");
            let plain = b
                .query(&sql)
                .await
                .unwrap_or_else(|e| panic!("{decision}/{col} as ub: {e}"));
            if !applies(decision, kind) {
                // role a has no rule here: protected columns deny, others stay plaintext
                let r = a.query(&sql).await;
                if col == "ssn" || col == "balance" {
                    let e = r.expect_err("denied");
                    assert!(e.contains("access denied"), "{decision}/{col}: {e}");
                } else {
                    let got = r.unwrap_or_else(|e| panic!("{decision}/{col}: {e}"));
                    assert_eq!(
                        column(&got, 1).to_data(),
                        column(&plain, 1).to_data(),
                        "{decision}/{col}"
                    );
                }
                continue;
            }
            match decision {
                "hide" => {
                    let e = a.query(&sql).await.expect_err("hidden");
                    assert!(
                        e.contains(&format!("No field named {col}")),
                        "{decision}/{col}: {e}"
                    );
                    let star = a
                        .query(&format!("SELECT * FROM {table} LIMIT 1"))
                        .await
                        .unwrap();
                    assert!(
                        star[0].schema().field_with_name(col).is_err(),
                        "{col} hidden from SELECT *"
                    );
                }
                "deny" => {
                    for q in [
                        sql.clone(),
                        format!("SELECT count(*) FROM {table} WHERE {col} IS NULL"),
                        format!("SELECT * FROM {table}"),
                    ] {
                        let e = a.query(&q).await.expect_err("denied");
                        let named =
                            q.starts_with("SELECT *") || e.contains(&format!("column '{col}'"));
                        assert!(
                            named
                                && e.contains("access denied")
                                && e.contains("'ua'")
                                && e.contains("role:a"),
                            "{decision}/{col}: {e}"
                        );
                    }
                }
                _ => {
                    let masked = a
                        .query(&sql)
                        .await
                        .unwrap_or_else(|e| panic!("{decision}/{col} as ua: {e}"));
                    assert_eq!(column(&masked, 0).len(), 500.min(column(&plain, 0).len()));
                    expect_masked(decision, kind, &column(&plain, 1), &column(&masked, 1), col);
                }
            }
        }
    }
}

fn text(a: &ArrayRef, i: usize) -> Option<String> {
    if a.is_null(i) {
        return None;
    }
    let s = cast(&a.slice(i, 1), &DataType::Utf8).expect("castable to text");
    Some(s.as_string::<i32>().value(0).to_owned())
}

/// Asserts `masked` is `plain` under `decision`, row by row.
pub fn expect_masked(decision: &str, kind: Kind, plain: &ArrayRef, masked: &ArrayRef, col: &str) {
    assert_eq!(plain.len(), masked.len());
    for i in 0..plain.len() {
        let (p, m) = (text(plain, i), text(masked, i));
        let ctx = format!("{decision} on {col} row {i}: plain {p:?} masked {m:?}");
        match decision {
            "plaintext" => assert_eq!(p, m, "{ctx}"),
            "null" => assert_eq!(m, None, "{ctx}"),
            "fixed" => {
                let want = match kind {
                    Kind::String => "****",
                    Kind::Decimal => "0.00",
                    Kind::Date => "1970-01-01",
                    Kind::Timestamp => "1970-01-01T00:00:00Z",
                    Kind::Nested => "[]",
                };
                assert_eq!(m.as_deref(), Some(want), "{ctx}");
            }
            "show_last_4" | "show_first_4" => {
                let p = p.clone().map(|s| {
                    let n = s.chars().count();
                    s.chars()
                        .enumerate()
                        .map(|(j, c)| {
                            let kept = if decision == "show_first_4" {
                                j < 4
                            } else {
                                j + 4 >= n
                            };
                            if kept || !c.is_alphanumeric() { c } else { 'X' }
                        })
                        .collect::<String>()
                });
                assert_eq!(m, p, "{ctx}");
            }
            "sha256" => assert_eq!(
                m,
                p.map(|s| hex::encode(Sha256::digest(s.as_bytes()))),
                "{ctx}"
            ),
            "truncate_to_year" | "truncate_to_month" => {
                let p = p.map(|s| {
                    let (y, rest) = s.split_at(4);
                    let month = if decision == "truncate_to_month" {
                        &rest[1..3]
                    } else {
                        "01"
                    };
                    match kind {
                        Kind::Date => format!("{y}-{month}-01"),
                        _ => format!("{y}-{month}-01T00:00:00Z"),
                    }
                });
                assert_eq!(m, p, "{ctx}");
            }
            other => panic!("no expectation for {other}"),
        }
    }
}

/// Column `i` of `batches`, as one array.
pub fn column(batches: &[RecordBatch], i: usize) -> ArrayRef {
    let parts: Vec<ArrayRef> = batches.iter().map(|b| Arc::clone(b.column(i))).collect();
    let refs: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
    datafusion::arrow::compute::concat(&refs).expect("same type")
}
