use crate::model::{Decision, Mask, TableDecision};
use crate::{Policy, RangerOptions, import_ranger};

/// A Hive service's export in Ranger 2.4's shape: access, masking and row-filter policies,
/// a wildcard, a column-level grant, a disabled policy and a Kafka policy.
const EXPORT: &str = include_str!("../../tests/fixtures/ranger_hive_export.json");

const BASE: &str = r#"# our base policy: comments stay
[roles]
admin = {}
analyst = {}
support = {}
contractors = {}

[users]
admin = { roles = ["admin"] }
analyst = { roles = ["analyst"] }
support = { roles = ["support"] }
both = { roles = ["analyst", "support"] }   # analyst and support
temp = { roles = ["analyst", "contractors"] }

[tables."lake.sales.customers".columns.ssn]
master_key = "pii_key"   # the key stays
access = { analyst = "plaintext" }
"#;

const LAKE: RangerOptions<'static> = RangerOptions {
    catalog: "lake",
    service: None,
};

fn import(base: Option<&str>) -> (Policy, crate::RangerImport) {
    let i = import_ranger(
        EXPORT,
        "export.json",
        &LAKE,
        base.map(|b| (b, "policy.toml")),
    )
    .unwrap();
    (Policy::parse(&i.policy_text, "out.toml").unwrap(), i)
}

const CUSTOMERS: &str = "lake.sales.customers";
const ORDERS: &str = "lake.sales.orders";

#[test]
fn access_masks_and_row_filters_follow_the_export() {
    let (p, i) = import(Some(BASE));
    let read = |u: &str, t: &str| p.table_access(u, t).0;
    let col = |u: &str, c: &str| p.decide(u, CUSTOMERS, c).decision;
    assert_eq!(read("analyst", CUSTOMERS), TableDecision::Allow);
    assert_eq!(read("support", CUSTOMERS), TableDecision::Allow);
    assert_eq!(read("admin", CUSTOMERS), TableDecision::Allow);
    // support is not granted orders.
    assert_eq!(read("support", ORDERS), TableDecision::Deny);
    assert_eq!(read("loader", ORDERS), TableDecision::Allow);
    assert_eq!(col("analyst", "ssn"), Decision::Mask(Mask::ShowLast4));
    assert_eq!(col("admin", "ssn"), Decision::Plaintext);
    // MASK_NULL for `public` is the `*` rule.
    assert_eq!(col("support", "ssn"), Decision::Mask(Mask::Null));
    assert_eq!(col("analyst", "email"), Decision::Mask(Mask::Sha256));
    assert_eq!(col("support", "email"), Decision::Plaintext);
    assert_eq!(
        col("analyst", "birth_date"),
        Decision::Mask(Mask::TruncateToYear)
    );
    assert_eq!(col("support", "phone"), Decision::Deny);
    assert_eq!(col("analyst", "phone"), Decision::Plaintext);
    let filter = |u: &str| p.row_filter(u, ORDERS).unwrap().predicates;
    assert_eq!(filter("analyst"), ["status = 'shipped'"]);
    assert_eq!(filter("admin"), ["true"]);
    // Writes: `all`, or update + alter + drop together; update alone grants none.
    assert!(p.may_write_table("admin", ORDERS));
    assert!(p.may_write_table("admin", CUSTOMERS));
    assert!(!p.may_write_table("analyst", ORDERS));
    assert!(!p.may_write_table("loader", ORDERS));
    // The base's key and comments stay; its rule for ssn is the export's now.
    assert_eq!(
        p.table(CUSTOMERS).unwrap().columns["ssn"]
            .master_key
            .as_deref(),
        Some("pii_key")
    );
    assert!(i.policy_text.contains("# our base policy: comments stay"));
    assert!(i.policy_text.contains("# the key stays"));
    let notes = i.notes.join("\n");
    for expected in [
        "policy 1 'all - database, table, column' (cm_hive): its database '*' is a wildcard: its grants are not imported",
        "policy 5 'interns: names only' (cm_hive): grants on columns name, country only",
        "policy 30 'old deny' (cm_hive): disabled: skipped",
        "policy 40 'kafka topics' (cm_kafka): service type 'kafka' is not Hive or Trino: skipped",
        "policy 3 'sales orders' (cm_hive): grants only some of update, alter, drop",
        "MASK_HASH is an unkeyed sha256",
        "lake.sales.customers.ssn: the base's access replaced by the export's",
        "users loader were added without roles",
    ] {
        assert!(
            notes.contains(expected),
            "no note '{expected}' in:\n{notes}"
        );
    }
}

#[test]
fn users_in_several_roles_get_rangers_answer_not_the_most_permissive_role() {
    let (p, i) = import(Some(BASE));
    // temp is an analyst (granted) and a contractor (denied): Ranger's deny wins.
    assert_eq!(p.table_access("temp", CUSTOMERS).0, TableDecision::Deny);
    // both: analyst's MASK_HASH is the first item matching, not support's MASK_NONE.
    assert_eq!(
        p.decide("both", CUSTOMERS, "email").decision,
        Decision::Mask(Mask::Sha256)
    );
    // both: support's column deny wins over analyst's plaintext.
    assert_eq!(
        p.decide("both", CUSTOMERS, "phone").decision,
        Decision::Deny
    );
    let notes = i.notes.join("\n");
    assert!(
        notes.contains("temp denied lake.sales.customers")
            && notes.contains("both sha256 on lake.sales.customers.email"),
        "{notes}"
    );
    // Without the base there are no memberships to reconcile: no user rules.
    let (p, i) = import(None);
    assert!(p.user_names().all(|u| u != "temp"));
    assert!(!i.notes.join("\n").contains("user rule(s) were added"));
}

#[test]
fn the_row_filter_macro_becomes_principal_attr_and_etl_writes_orders() {
    let base = BASE
        .replace(
            "temp = {",
            "etl1 = { roles = [\"etl\"], attributes = { status = \"placed\" } }\ntemp = {",
        )
        .replace("contractors = {}", "contractors = {}\netl = {}");
    let (p, _) = import(Some(&base));
    assert_eq!(
        p.row_filter("etl1", ORDERS).unwrap().predicates,
        ["status = principal_attr('status')"]
    );
    assert!(p.may_write_table("etl1", ORDERS));
    assert!(!p.may_write_table("etl1", CUSTOMERS));
}

#[test]
fn a_restriction_clearice_cannot_express_fails_naming_the_policy() {
    // Policy 1 with a deny item: a deny on `*` tables.
    let mut v: serde_json::Value = serde_json::from_str(EXPORT).unwrap();
    v["policies"][0]["denyPolicyItems"] = serde_json::json!([{"accesses": [{"type": "select", "isAllowed": true}], "groups": ["contractors"]}]);
    let e = import_ranger(&v.to_string(), "export.json", &LAKE, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("Ranger export 'export.json': policy 1 'all - database, table, column' (cm_hive): its database '*' is a wildcard, and ClearIce cannot express its restriction there"),
        "{e}"
    );
    // A mask for `{OWNER}`.
    let mut v: serde_json::Value = serde_json::from_str(EXPORT).unwrap();
    v["policies"][5]["dataMaskPolicyItems"][1]["users"] = serde_json::json!(["{OWNER}"]);
    let e = import_ranger(&v.to_string(), "export.json", &LAKE, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("policy 10 'customers ssn'")
            && e.contains("user '{OWNER}' has no ClearIce equivalent"),
        "{e}"
    );
    // Not JSON.
    let e = import_ranger("{", "export.json", &LAKE, None)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("Ranger export 'export.json': EOF"), "{e}");
}

#[test]
fn a_service_filter_and_trino_catalogs_select_what_is_imported() {
    let only = RangerOptions {
        catalog: "lake",
        service: Some("cm_kafka"),
    };
    let i = import_ranger(EXPORT, "export.json", &only, None).unwrap();
    assert!(
        Policy::parse(&i.policy_text, "o")
            .unwrap()
            .table(CUSTOMERS)
            .is_none()
    );
    let trino = serde_json::json!({"policies": [
        {"id": 1, "name": "t", "service": "trino", "serviceType": "trino", "policyType": 0,
         "resources": {"catalog": {"values": ["lake"]}, "schema": {"values": ["sales"]}, "table": {"values": ["orders"]}, "column": {"values": ["*"]}},
         "policyItems": [{"accesses": [{"type": "select"}, {"type": "insert"}, {"type": "delete"}, {"type": "update"}, {"type": "alter"}, {"type": "drop"}], "users": ["ann"]}]},
        {"id": 2, "name": "other", "service": "trino", "serviceType": "trino", "policyType": 0,
         "resources": {"catalog": {"values": ["hive"]}, "schema": {"values": ["x"]}, "table": {"values": ["y"]}},
         "denyPolicyItems": [{"accesses": [{"type": "select"}], "groups": ["g"]}]}
    ]});
    let i = import_ranger(&trino.to_string(), "t.json", &LAKE, None).unwrap();
    let p = Policy::parse(&i.policy_text, "o").unwrap();
    assert_eq!(p.table_access("ann", ORDERS).0, TableDecision::Allow);
    assert!(p.may_write_table("ann", ORDERS));
    assert!(p.tables().all(|(t, _)| t == ORDERS), "{}", i.policy_text);
    assert!(
        i.notes
            .join("\n")
            .contains("policy 2 'other' (trino): another Trino catalog's")
    );
}

#[test]
fn what_ranger_decides_by_order_zone_or_condition_fails_and_a_named_write_deny_drops_role_grants() {
    let fails = |edit: &dyn Fn(&mut serde_json::Value), says: &str| {
        let mut v: serde_json::Value = serde_json::from_str(EXPORT).unwrap();
        edit(&mut v);
        let e = import_ranger(&v.to_string(), "export.json", &LAKE, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains(says), "{says}: {e}");
    };
    fails(
        &|v| v["policies"][1]["isDenyAllElse"] = true.into(),
        "policy 2 'sales customers' (cm_hive): isDenyAllElse",
    );
    fails(
        &|v| v["policies"][1]["zoneName"] = "finance".into(),
        "zone 'finance'",
    );
    fails(
        &|v| {
            v["policies"][5]["dataMaskPolicyItems"][1]["conditions"] =
                serde_json::json!([{"type": "ip-range", "values": ["10.0.0.0/8"]}])
        },
        "policy 10 'customers ssn' (cm_hive): a mask or row filter with conditions",
    );
    // A second masking policy on ssn.
    fails(
        &|v| {
            let mut second = v["policies"][5].clone();
            second["id"] = 99.into();
            second["name"] = "more ssn".into();
            v["policies"].as_array_mut().unwrap().push(second);
        },
        "policy 99 'more ssn' (cm_hive) and policy 10 'customers ssn' (cm_hive) both mask or filter column 'lake.sales.customers.ssn'",
    );
    fails(
        &|v| {
            v["policies"][0]["serviceType"] = "tag".into();
            v["policies"][0]["denyPolicyItems"] =
                serde_json::json!([{"accesses": [{"type": "select"}], "groups": ["g"]}]);
        },
        "a tag-based restriction",
    );
    // A user denied writes who is in a granted role: the role's grant goes.
    let mut v: serde_json::Value = serde_json::from_str(EXPORT).unwrap();
    v["policies"][2]["denyPolicyItems"] =
        serde_json::json!([{"accesses": [{"type": "UPDATE"}], "users": ["bob"]}]);
    let i = import_ranger(&v.to_string(), "export.json", &LAKE, None).unwrap();
    let p = Policy::parse(&i.policy_text, "o").unwrap();
    assert!(!p.may_write_table("bob", ORDERS));
    assert!(
        p.table(ORDERS).unwrap().write.as_ref().unwrap().is_empty(),
        "{}",
        i.policy_text
    );
    assert!(
        i.notes
            .join("\n")
            .contains("lake.sales.orders: someone is denied changing it")
    );
}

#[test]
fn a_base_policy_that_hides_what_it_denies_still_imports() {
    // The import compares the rules with Ranger's decisions (a deny is a deny), not what
    // hide_inaccessible_columns turns them into.
    let base = format!("hide_inaccessible_columns = true\n{BASE}");
    let (hiding, _) = import(Some(&base));
    let (plain, _) = import(Some(BASE));
    for user in ["admin", "analyst", "support", "both", "temp"] {
        for column in ["ssn", "email", "phone"] {
            let (h, p) = (
                hiding.decide(user, CUSTOMERS, column).decision,
                plain.decide(user, CUSTOMERS, column).decision,
            );
            let expected = if p == Decision::Deny {
                Decision::Hide
            } else {
                p
            };
            assert_eq!(h, expected, "{user} {column}");
        }
    }
}
