//! Which keys a scan asks for: only those of columns the principal reads in plaintext or
//! through a mask that needs the value; a column the policy does not name stays
//! encrypted even when its key is one the policy grants for another column.

use crate::lake::interop;

use clearice_testkit::matrix::NULL_PII as CONSTANT_MASKS;

#[tokio::test]
async fn keys_of_columns_not_needed_are_never_requested() {
    let Some(lake) = interop().await else { return };
    let r = &lake.resolver;
    let a = lake.session(CONSTANT_MASKS, "ua");
    // Only constant masks of pii_key columns: pii_key is never unwrapped.
    let rows = a
        .sql("SELECT ssn, email FROM lake.sales.customers WHERE email IS NOT NULL LIMIT 5")
        .await
        .unwrap();
    let (ssn, email) = (rows[0].column(0), rows[0].column(1));
    assert_eq!(ssn.null_count(), ssn.len());
    let email =
        datafusion::arrow::compute::cast(email, &datafusion::arrow::datatypes::DataType::Utf8)
            .unwrap();
    use datafusion::arrow::array::AsArray;
    assert!(email.as_string::<i32>().iter().all(|v| v == Some("****")));
    assert_eq!(r.kms_unwrap_count_for("pii_key"), 0);
    assert_eq!(r.kms_unwrap_count_for("finance_key"), 0);
    assert!(r.kms_unwrap_count_for("footer_key") > 0);
    a.sql("SELECT sum(balance) FROM lake.sales.customers")
        .await
        .unwrap();
    assert!(r.kms_unwrap_count_for("finance_key") > 0);
    assert_eq!(r.kms_unwrap_count_for("pii_key"), 0);
    // The admin's plaintext read does need it.
    lake.session(CONSTANT_MASKS, "root")
        .sql("SELECT ssn FROM lake.sales.customers")
        .await
        .unwrap();
    assert!(r.kms_unwrap_count_for("pii_key") > 0);
}

#[tokio::test]
async fn an_undeclared_column_sharing_a_declared_key_stays_encrypted() {
    let Some(lake) = interop().await else { return };
    let policy = "[roles]\na = {}\n[users]\nua = { roles = [\"a\"] }\n\
                  [tables.\"lake.sales.customers\".columns.ssn]\nmaster_key = \"pii_key\"\n\
                  access = { a = \"plaintext\" }\n";
    let s = lake.session(policy, "ua");
    let ssn = s
        .sql("SELECT ssn FROM lake.sales.customers WHERE ssn IS NOT NULL LIMIT 3")
        .await
        .unwrap();
    assert_eq!(ssn.iter().map(|b| b.num_rows()).sum::<usize>(), 3);
    for sql in [
        "SELECT email FROM lake.sales.customers LIMIT 1",
        "SELECT ssn, email FROM lake.sales.customers LIMIT 1",
        "SELECT count(*) FROM lake.sales.customers WHERE email LIKE '%@example.com'",
    ] {
        let e = s.sql(sql).await.expect_err(sql);
        assert!(e.contains("email") && e.contains("pii_key"), "{sql}: {e}");
    }
    // With `email` declared, it reads.
    let declared = format!(
        "{policy}[tables.\"lake.sales.customers\".columns.email]\nmaster_key = \"pii_key\"\n\
         access = {{ a = \"plaintext\" }}\n"
    );
    let n = lake
        .session(&declared, "ua")
        .sql("SELECT count(*) FROM lake.sales.customers WHERE email LIKE '%@example.com'")
        .await
        .unwrap();
    let n = n[0]
        .column(0)
        .as_any()
        .downcast_ref::<datafusion::arrow::array::Int64Array>()
        .unwrap()
        .value(0);
    assert!(n > 0);
}
