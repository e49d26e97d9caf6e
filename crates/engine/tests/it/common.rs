//! The engine tests' helpers: engines over configs, queries, result conversion; fixture
//! locations and peers from `clearice-testkit`.

use std::path::Path;
use std::sync::Arc;

use clearice_engine::{Config, Engine, Session};
use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{
    DataType, Date32Type, Decimal128Type, Int32Type, Int64Type, TimeUnit, TimestampMicrosecondType,
};
use serde_json::Value;
use std::process::Command;

pub use clearice_testkit::*;

/// An engine over config text written into `dir`.
pub async fn engine(dir: &Path, toml: &str) -> Arc<Engine> {
    engine_at(dir, "clearice.toml", toml).await
}

/// A demo lake created in `dir` and an engine over its config.
pub async fn demo_engine(dir: &Path) -> Arc<Engine> {
    let config = clearice_demo::init(dir).await.unwrap();
    Arc::new(Engine::open(Config::load(&config).unwrap()).await.unwrap())
}

/// An engine over config text written into `dir/name`.
pub async fn engine_at(dir: &Path, name: &str, toml: &str) -> Arc<Engine> {
    let path = dir.join(name);
    std::fs::write(&path, toml).unwrap();
    Arc::new(Engine::open(Config::load(&path).unwrap()).await.unwrap())
}

/// Creates table `ns.name` (`id` long, `ssn` string) and appends `ssns` (ids 1..) with
/// `ssn` under master key `column_key` and the footer under `footer_key`.
pub async fn write_id_ssn_table(
    catalog: &dyn iceberg::Catalog,
    ns: &iceberg::NamespaceIdent,
    name: &str,
    kms: &Arc<dyn clearice_crypto::Kms>,
    (footer_key, column_key): (&str, &str),
    ssns: &[&str],
) {
    use datafusion::arrow::array::{Int64Array, StringArray};
    use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
    let schema = Schema::builder()
        .with_fields(vec![
            NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
            NestedField::optional(2, "ssn", Type::Primitive(PrimitiveType::String)).into(),
        ])
        .build()
        .unwrap();
    let table = catalog
        .create_table(
            ns,
            iceberg::TableCreation::builder()
                .name(name.into())
                .schema(schema)
                .build(),
        )
        .await
        .unwrap();
    let arrow = Arc::new(
        iceberg::arrow::schema_to_arrow_schema(table.metadata().current_schema()).unwrap(),
    );
    let batch = RecordBatch::try_new(
        arrow,
        vec![
            Arc::new(Int64Array::from_iter_values(1..=ssns.len() as i64)),
            Arc::new(StringArray::from(ssns.to_vec())),
        ],
    )
    .unwrap();
    let spec = clearice_iceberg::write::EncryptionSpec {
        footer_key_id: footer_key.into(),
        column_keys: [("ssn".to_string(), column_key.to_string())].into(),
        plaintext_footer: false,
        aad_prefix: None,
    };
    clearice_iceberg::write::append_encrypted(catalog, &table, &[batch], &spec, Arc::clone(kms))
        .await
        .unwrap();
}

/// Config over the interop lake (catalog `lake`) with `keyring`.
pub fn interop_config(interop: &Path, keyring: &Path) -> String {
    format!(
        "[catalogs.lake]\ntype = \"sql\"\nuri = \"sqlite://{i}/catalog.db\"\nwarehouse = \"file://{i}/warehouse\"\n\
         [kms]\ntype = \"keyring\"\npath = \"{k}\"\n",
        i = interop.display(),
        k = keyring.display()
    )
}

/// The text of `EXPLAIN sql` in `session` (logical and physical plans, as a table).
pub async fn plan_text(session: &Session, sql: &str) -> String {
    let batches = query(session, &format!("EXPLAIN {sql}")).await.unwrap();
    datafusion::arrow::util::pretty::pretty_format_batches(&batches)
        .unwrap()
        .to_string()
}

/// Runs SQL and collects batches.
pub async fn query(ctx: &Session, sql: &str) -> datafusion::error::Result<Vec<RecordBatch>> {
    Ok(ctx.sql(sql).await?.batches)
}

/// Runs SQL; the error as one string (panics if it succeeds).
pub async fn query_err(ctx: &Session, sql: &str) -> String {
    match query(ctx, sql).await {
        Ok(b) => panic!("expected an error for {sql}, got {} batches", b.len()),
        Err(e) => e.to_string(),
    }
}

/// Rows as JSON values with expected.json's conventions.
pub fn json_rows(batches: &[RecordBatch]) -> Vec<Vec<Value>> {
    let mut rows = Vec::new();
    for b in batches {
        for r in 0..b.num_rows() {
            rows.push(b.columns().iter().map(|c| cell(c, r)).collect());
        }
    }
    rows
}

fn cell(a: &ArrayRef, r: usize) -> Value {
    if a.is_null(r) {
        return Value::Null;
    }
    match a.data_type() {
        DataType::Int64 => a.as_primitive::<Int64Type>().value(r).into(),
        DataType::Int32 => a.as_primitive::<Int32Type>().value(r).into(),
        DataType::Utf8 => a.as_string::<i32>().value(r).into(),
        DataType::Utf8View => a.as_string_view().value(r).into(),
        DataType::Decimal128(_, scale) => {
            let v = a.as_primitive::<Decimal128Type>().value(r);
            let s = *scale as u32;
            let (neg, abs) = (v < 0, v.unsigned_abs());
            let p = 10u128.pow(s);
            format!(
                "{}{}.{:0w$}",
                if neg { "-" } else { "" },
                abs / p,
                abs % p,
                w = s as usize
            )
            .into()
        }
        DataType::Date32 => {
            let d = a.as_primitive::<Date32Type>().value(r);
            (chrono::NaiveDate::from_ymd_opt(1970, 1, 1).unwrap()
                + chrono::Duration::days(d as i64))
            .to_string()
            .into()
        }
        DataType::Timestamp(TimeUnit::Microsecond, Some(_)) => {
            let t = a.as_primitive::<TimestampMicrosecondType>().value(r);
            chrono::DateTime::from_timestamp_micros(t)
                .unwrap()
                .format("%Y-%m-%dT%H:%M:%S%.6fZ")
                .to_string()
                .into()
        }
        DataType::Dictionary(_, _) => {
            let s = datafusion::arrow::compute::cast(a, &DataType::Utf8).unwrap();
            cell(&s, r)
        }
        DataType::List(_) => {
            let l = a.as_list::<i32>().value(r);
            Value::Array((0..l.len()).map(|i| cell(&l, i)).collect())
        }
        other => panic!("no JSON convention for {other}"),
    }
}

/// `CREATE EXTERNAL TABLE name STORED AS PARQUET LOCATION 'path'`.
pub async fn register(ctx: &Session, name: &str, path: &Path) -> datafusion::error::Result<()> {
    let sql = format!(
        "CREATE EXTERNAL TABLE {name} STORED AS PARQUET LOCATION '{}'",
        path.display()
    );
    ctx.sql(&sql).await.map(|_| ())
}

/// Asserts every query of the interop lake's expected.json (DuckDB over the plaintext twin)
/// over `table` as `principal`.
pub async fn assert_expected(engine: &Engine, interop: &Path, table: &str, principal: &str) {
    let exp: Value =
        serde_json::from_slice(&std::fs::read(interop.join("expected.json")).unwrap()).unwrap();
    let ctx = engine.session(principal);
    let queries = exp["queries"].as_array().unwrap();
    assert!(queries.len() >= 8);
    for q in queries {
        let sql = q["sql"]
            .as_str()
            .unwrap()
            .replace("FROM customers", &format!("FROM {table}"));
        let batches = query(&ctx, &sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        let want: Vec<Vec<Value>> = serde_json::from_value(q["rows"].clone()).unwrap();
        assert_eq!(
            json_rows(&batches),
            want,
            "query {} over {table}",
            q["name"]
        );
    }
}

/// Runs `tests/python/SCRIPT` with `args`; its stdout as JSON.
pub fn run_python(python: &str, script: &str, args: &[&str]) -> Value {
    let out = Command::new(python)
        .arg(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/python")
                .join(script),
        )
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script} {}: {}",
        args.first().unwrap_or(&""),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}
