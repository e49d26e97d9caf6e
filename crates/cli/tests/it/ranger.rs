//! `clearice policy import-ranger`: a Ranger Hive export (access, masking and row-filter
//! policies) imported onto the demo lake's policy, then queried as its users.

use std::path::{Path, PathBuf};
use std::process::Command;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_clearice"));
    c.env_remove("CLEARICE_CONFIG").env("CLEARICE_LOG", "warn");
    c
}

fn export() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../policy/tests/fixtures/ranger_hive_export.json")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn a_ranger_export_imported_onto_the_demo_lake_decides_its_queries() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("lake");
    let o = bin().args(["demo", "init"]).arg(&dir).output().unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let policy = dir.join("policy.toml");
    // temp is an analyst (granted customers) and a contractor (denied them).
    let base = std::fs::read_to_string(&policy)
        .unwrap()
        .replace(
            "[users]\n",
            "[users]\ntemp = { roles = [\"analyst\", \"contractors\"] }\n",
        )
        .replace("[roles]\n", "[roles]\ncontractors = {}\n");
    std::fs::write(&policy, &base).unwrap();
    let import = |export: &Path| {
        bin()
            .args(["policy", "import-ranger"])
            .arg(export)
            .args(["--catalog", "lake", "--base"])
            .arg(&policy)
            .arg("-o")
            .arg(&policy)
            .output()
            .unwrap()
    };
    let o = import(&export());
    let notes = text(&o.stderr);
    assert!(o.status.success(), "{notes}");
    assert!(
        notes.contains("note: policy 1 'all - database, table, column' (cm_hive): its database '*' is a wildcard")
            && notes.contains("note: 1 user rule(s) were added")
            && notes.contains("temp denied lake.sales.customers"),
        "{notes}"
    );
    let imported = std::fs::read_to_string(&policy).unwrap();
    assert!(
        imported.starts_with("# ClearIce demo policy."),
        "the base's comments stay"
    );
    let config = dir.join("clearice.toml");
    let o = bin()
        .arg("--config")
        .arg(&config)
        .args(["policy", "check"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}{}", text(&o.stdout), text(&o.stderr));

    let query = |user: &str, sql: &str| {
        bin()
            .arg("--config")
            .arg(&config)
            .args(["--user", user, "-q", "--format", "csv", "-c", sql])
            .output()
            .unwrap()
    };
    let ok = |user: &str, sql: &str| {
        let o = query(user, sql);
        assert!(o.status.success(), "{user}: {sql}: {}", text(&o.stderr));
        text(&o.stdout)
    };
    let denied = |user: &str, sql: &str, what: &str| {
        let o = query(user, sql);
        let e = text(&o.stderr);
        assert_eq!(o.status.code(), Some(4), "{user}: {sql}: {e}");
        assert!(e.contains(what), "{user}: {sql}: {e}");
    };
    let ssn = "SELECT ssn FROM lake.sales.customers WHERE id = 1000001";
    assert_eq!(ok("admin", ssn), "ssn\n609-11-1603\n"); // MASK_NONE
    assert_eq!(ok("analyst", ssn), "ssn\nXXX-XX-1603\n"); // MASK_SHOW_LAST_4
    assert_eq!(ok("support", ssn), "ssn\n\"\"\n"); // public's MASK_NULL
    denied(
        "support",
        "SELECT phone FROM lake.sales.customers",
        "column 'phone'",
    );
    denied(
        "support",
        "SELECT count(*) FROM lake.sales.orders",
        "lake.sales.orders",
    );
    denied(
        "temp",
        "SELECT id FROM lake.sales.customers",
        "lake.sales.customers",
    );
    // The analyst's row filter: shipped orders only.
    let counts = "SELECT count(*) AS n, count(*) FILTER (WHERE status <> 'shipped') AS other FROM lake.sales.orders";
    let analyst = ok("analyst", counts);
    let admin = ok("admin", counts);
    let n = |csv: &str| -> Vec<u64> {
        csv.lines()
            .nth(1)
            .unwrap()
            .split(',')
            .map(|v| v.parse().unwrap())
            .collect()
    };
    assert_eq!(n(&analyst)[1], 0, "{analyst}");
    assert!(
        n(&analyst)[0] > 0 && n(&analyst)[0] < n(&admin)[0],
        "{analyst} {admin}"
    );
    assert!(n(&admin)[1] > 0, "{admin}");

    // A deny ClearIce cannot express fails in one line and leaves the policy as it was.
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(export()).unwrap()).unwrap();
    v["policies"][0]["denyPolicyItems"] = serde_json::json!([
        {"accesses": [{"type": "select", "isAllowed": true}], "groups": ["contractors"]}
    ]);
    let bad = tmp.path().join("bad.json");
    std::fs::write(&bad, v.to_string()).unwrap();
    let o = import(&bad);
    let e = text(&o.stderr);
    assert_ne!(o.status.code(), Some(0), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.contains("policy 1 'all - database, table, column' (cm_hive): its database '*' is a wildcard, and ClearIce cannot express its restriction"),
        "{e}"
    );
    assert_eq!(std::fs::read_to_string(&policy).unwrap(), imported);
}
