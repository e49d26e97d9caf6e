//! The real `clearice` binary: demo init, `-c`/`-f`, formats, errors, `slt`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_clearice"));
    c.env_remove("CLEARICE_CONFIG").env("CLEARICE_LOG", "warn");
    c
}

/// One demo lake shared by the tests of this binary (writing it takes seconds).
fn lake() -> &'static Path {
    static LAKE: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &LAKE
        .get_or_init(|| {
            let tmp = tempfile::tempdir().unwrap();
            let out = bin()
                .args(["demo", "init"])
                .arg(tmp.path().join("lake"))
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let config = tmp.path().join("lake/clearice.toml");
            (tmp, config)
        })
        .1
}

fn run(args: &[&str]) -> Output {
    bin()
        .arg("--config")
        .arg(lake())
        .args(["--user", "admin"])
        .args(args)
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn count_prints_as_csv() {
    let o = run(&[
        "--format",
        "csv",
        "-c",
        "SELECT count(*) FROM lake.sales.customers",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "count(*)\n100000\n");
    assert!(stderr(&o).contains("1 row in"), "{}", stderr(&o));
}

#[test]
fn several_commands_and_statements_run_in_order_with_quiet_json() {
    let o = run(&[
        "-q",
        "--format",
        "ndjson",
        "-c",
        "SELECT 1 AS a; SELECT 2 AS a",
        "-c",
        "SELECT ssn FROM lake.sales.customers WHERE id = 1000001",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "{\"a\":1}\n{\"a\":2}\n{\"ssn\":\"609-11-1603\"}\n"
    );
    assert_eq!(stderr(&o), "");
}

#[test]
fn file_with_ddl_backslash_and_queries_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let f = tmp.path().join("q.sql");
    std::fs::write(&f, "\\d\nSELECT count(*) AS n\n  FROM lake.sales.orders;\n").unwrap();
    let o = run(&["-q", "--format", "tsv", "-f", f.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    assert!(s.contains("lake\tsales\tcustomers\tBASE TABLE"), "{s}");
    assert!(s.ends_with("n\n200000\n"), "{s}");
}

#[test]
fn nested_columns_render_in_csv() {
    let o = run(&[
        "-q",
        "--format",
        "csv",
        "-c",
        "SELECT tags FROM lake.sales.customers WHERE id = 1000000",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // JSON text, CSV-quoted: a reader gets back ["b2b","vip","newsletter"].
    assert_eq!(
        stdout(&o),
        "tags\n\"[\"\"b2b\"\",\"\"vip\"\",\"\"newsletter\"\"]\"\n"
    );
}

#[test]
fn copy_of_nested_columns_to_csv_names_the_column_and_leaves_no_file() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("out.csv");
    let o = run(&[
        "-c",
        &format!(
            "COPY (SELECT id, tags FROM lake.sales.customers) TO '{}' STORED AS CSV",
            target.display()
        ),
    ]);
    assert_eq!(o.status.code(), Some(3));
    let e = stderr(&o);
    assert!(
        e.lines().count() == 1 && e.contains("column 'tags' is a list"),
        "{e}"
    );
    assert!(!target.exists());
}

#[test]
fn shell_table_shows_a_row_limit_with_the_count_of_the_rest() {
    let mut child = bin()
        .arg("--config")
        .arg(lake())
        .args(["--user", "admin"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"SELECT id FROM lake.sales.customers;\n")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    let out = stdout(&o);
    assert_eq!(
        out.lines().filter(|l| l.starts_with("| 10")).count(),
        40,
        "{out}"
    );
    assert!(out.contains("(99960 more rows not shown"), "{out}");
    assert!(stderr(&o).contains("100000 rows"), "{}", stderr(&o));
}

#[test]
fn errors_are_one_line_and_exit_non_zero() {
    let o = run(&["-c", "SELECT * FROM lake.sales.nope"]);
    assert_eq!(o.status.code(), Some(3));
    let e = stderr(&o);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.starts_with("Error: ") && e.contains("lake.sales.nope"),
        "{e}"
    );
}

#[test]
fn malformed_config_names_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let c = tmp.path().join("bad.toml");
    std::fs::write(&c, "[catalogs.lake]\ntype = \"sql\"\nuri = 5\n").unwrap();
    let o = bin()
        .arg("--config")
        .arg(&c)
        .args(["-c", "SELECT 1"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("bad.toml") && e.contains("line 3") && e.lines().count() == 1,
        "{e}"
    );
}

#[test]
fn missing_keyring_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let c = tmp.path().join("c.toml");
    std::fs::write(&c, "[kms]\ntype = \"keyring\"\npath = \"nowhere.json\"\n").unwrap();
    let o = bin()
        .arg("--config")
        .arg(&c)
        .args(["-c", "SELECT 1"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("nowhere.json"), "{}", stderr(&o));
}

/// Exit codes follow the error's type (README, "Exit codes"), each with one error line.
#[test]
fn exit_codes_follow_the_error_type() {
    let check = |o: Output, code: i32, text: &str| {
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(code), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(e.starts_with("Error: ") && e.contains(text), "{e}");
    };
    check(run(&["-c", "SELEC 1"]), 3, "SELEC");
    check(
        run(&["-c", "SELECT no_such_column FROM lake.sales.customers"]),
        3,
        "no_such_column",
    );
    let analyst = |sql: &str| {
        bin()
            .arg("--config")
            .arg(lake())
            .args(["--user", "analyst", "-c", sql])
            .output()
            .unwrap()
    };
    check(
        analyst("SELECT card_number FROM lake.sales.orders"),
        4,
        "column 'card_number' of table 'lake.sales.orders' is denied to principal 'analyst'",
    );

    // A lake of its own: a confined shell with a one-second statement timeout, and a
    // data file with one byte flipped.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("lake");
    let o = bin().args(["demo", "init"]).arg(&dir).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let config = dir.join("clearice.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("\n[shell]\nconfine = true\n\n[server.limits]\nstatement_timeout_s = 1\n");
    std::fs::write(&config, text).unwrap();
    let own = |user: &str, sql: &str| {
        bin()
            .arg("--config")
            .arg(&config)
            .args(["--user", user, "-c", sql])
            .output()
            .unwrap()
    };
    check(
        own(
            "admin",
            "SELECT count(*) FROM lake.sales.customers a, lake.sales.customers b WHERE a.id + b.id = -1",
        ),
        7,
        "statement timeout",
    );
    check(
        own("admin", "COPY (SELECT 1) TO '/tmp/clearice-exit-code.csv'"),
        4,
        "/tmp/clearice-exit-code.csv",
    );
    let mut files: Vec<PathBuf> = walk(&dir.join("warehouse"))
        .into_iter()
        .filter(|p| {
            p.extension().is_some_and(|e| e == "parquet")
                && p.to_string_lossy().contains("customers")
        })
        .collect();
    files.sort_by_key(|p| std::fs::metadata(p).unwrap().len());
    let victim = files.last().expect("a customers data file");
    // Inside the encrypted footer (before its length and the "PARE" magic).
    let mut bytes = std::fs::read(victim).unwrap();
    let at = bytes.len() - 8 - 20;
    bytes[at] ^= 0x01;
    std::fs::write(victim, bytes).unwrap();
    check(
        own("admin", "SELECT count(ssn) FROM lake.sales.customers"),
        6,
        &victim.file_name().unwrap().to_string_lossy(),
    );
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn slt_reports_each_file_and_a_closing_line() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("a_pass.slt"),
        "query I\nSELECT count(*) FROM lake.sales.customers\n----\n100000\n",
    )
    .unwrap();
    std::fs::write(
        tmp.path().join("b_fail.slt"),
        "query I\nSELECT 1\n----\n2\n",
    )
    .unwrap();
    let o = bin()
        .arg("--config")
        .arg(lake())
        .args(["--user", "admin", "slt"])
        .arg(tmp.path())
        .output()
        .unwrap();
    let s = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{s}");
    assert!(s.contains("ok    ") && s.contains("a_pass.slt"), "{s}");
    assert!(s.contains("FAIL  ") && s.contains("b_fail.slt"), "{s}");
    assert!(
        s.trim_end()
            .ends_with("1 passed, 1 failed; 1 of 2 records passed (50.0 %)"),
        "{s}"
    );
    // A pass-rate floor turns the same run green, and a lower figure would not.
    let with_floor = |pct: &str| {
        bin()
            .arg("--config")
            .arg(lake())
            .args(["--user", "admin", "slt", "--min-pass-rate", pct])
            .arg(tmp.path())
            .output()
            .unwrap()
    };
    assert_eq!(with_floor("50").status.code(), Some(0));
    assert_eq!(with_floor("50.1").status.code(), Some(1));
    std::fs::remove_file(tmp.path().join("b_fail.slt")).unwrap();
    let o = bin()
        .arg("--config")
        .arg(lake())
        .args(["--user", "admin", "slt"])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stdout(&o));
}

#[test]
fn slt_times_out_a_file_and_gives_each_file_a_fresh_scratch_directory() {
    let tmp = tempfile::tempdir().unwrap();
    // Writes into scratch/c_scratch/ (DataFusion's convention), which starts empty.
    std::fs::write(
        tmp.path().join("c_scratch.slt"),
        "query I\nCOPY (SELECT 1 AS a) TO 'scratch/c_scratch/one.csv' STORED AS CSV\n----\n1\n\n\
         query I\nSELECT count(*) FROM 'scratch/c_scratch/'\n----\n1\n",
    )
    .unwrap();
    let stale = tmp.path().join("scratch/c_scratch");
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join("stale.csv"), "a\n7\n").unwrap();
    // A cross join that runs for minutes: the per-file timeout ends it.
    std::fs::write(
        tmp.path().join("d_slow.slt"),
        "query I\nSELECT count(*) FROM range(100000000) a, range(100000000) b WHERE a.value + b.value = 3\n----\n4\n",
    )
    .unwrap();
    let start = std::time::Instant::now();
    let o = bin()
        .current_dir(tmp.path())
        .arg("--config")
        .arg(lake())
        .args(["--user", "admin", "slt", "--timeout", "3", "-j", "2"])
        .arg(".")
        .output()
        .unwrap();
    let s = stdout(&o);
    assert!(start.elapsed() < std::time::Duration::from_secs(60), "{s}");
    assert_eq!(o.status.code(), Some(1), "{s}");
    assert!(s.contains("ok    ./c_scratch.slt"), "{s}");
    assert!(
        s.contains("FAIL  ./d_slow.slt (1 of 1 records failed)")
            && s.contains("timed out after 3 s"),
        "{s}"
    );
    assert!(!stale.join("stale.csv").exists());
}

#[test]
fn no_config_creates_the_default_demo_lake_on_first_run() {
    let home = tempfile::tempdir().unwrap();
    let o = bin()
        .env("HOME", home.path())
        .env("USER", "newcomer")
        .env_remove("CLEARICE_USER")
        .env("XDG_DATA_HOME", home.path().join("data"))
        .args([
            "--format",
            "csv",
            "-c",
            "SELECT count(*) FROM lake.sales.orders",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "count(*)\n200000\n");
    assert!(
        stderr(&o).contains("Creating the demo lake"),
        "{}",
        stderr(&o)
    );
    assert!(
        home.path()
            .join("data/clearice/demo/clearice.toml")
            .exists()
    );
}

#[test]
fn policy_check_passes_on_the_demo_and_names_problems() {
    let o = bin()
        .arg("--config")
        .arg(lake())
        .args(["policy", "check"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("OK (2 tables checked)"),
        "{}",
        stdout(&o)
    );
    // a policy that forgets phone's master key and puts a string mask on a date
    let dir = lake().parent().unwrap();
    let policy = std::fs::read_to_string(dir.join("policy.toml"))
        .unwrap()
        .replace(
            "[tables.\"lake.sales.customers\".columns.phone]\nmaster_key = \"pii_key\"\n",
            "[tables.\"lake.sales.customers\".columns.phone]\n",
        )
        .replace(
            "analyst = \"truncate_to_year\"",
            "analyst = \"show_last_4\"",
        );
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("bad.toml"), policy).unwrap();
    let config = std::fs::read_to_string(lake())
        .unwrap()
        .replace(
            "path = \"policy.toml\"",
            &format!("path = \"{}\"", tmp.path().join("bad.toml").display()),
        )
        .replace(
            "path = \"keyring.json\"",
            &format!("path = \"{}\"", dir.join("keyring.json").display()),
        )
        .replace(
            "path = \"audit.jsonl\"",
            &format!("path = \"{}\"", tmp.path().join("a.jsonl").display()),
        );
    std::fs::write(tmp.path().join("c.toml"), config).unwrap();
    let o = bin()
        .arg("--config")
        .arg(tmp.path().join("c.toml"))
        .args(["policy", "check"])
        .output()
        .unwrap();
    let s = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{s}");
    assert!(
        s.contains("lake.sales.customers.phone: encrypted under master key 'pii_key'"),
        "{s}"
    );
    assert!(
        s.contains("mask 'show_last_4' (for role analyst) does not apply to a Date column"),
        "{s}"
    );
    // The same mask also stops the analyst's `SELECT *` from planning.
    assert!(
        s.contains("lake.sales.customers: SELECT * does not plan for user 'analyst'"),
        "{s}"
    );
    assert!(s.contains("3 problem(s)"), "{s}");
}

/// A table whose files cannot be planned (its manifest list is gone) is a problem, not OK.
#[test]
fn policy_check_reports_a_table_it_cannot_plan() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("lake");
    let o = bin().args(["demo", "init"]).arg(&dir).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let lists: Vec<PathBuf> = walk(&dir.join("warehouse"))
        .into_iter()
        .filter(|p| {
            p.to_string_lossy().contains("orders")
                && p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("snap-")
        })
        .collect();
    assert!(!lists.is_empty());
    for l in &lists {
        std::fs::remove_file(l).unwrap();
    }
    let o = bin()
        .arg("--config")
        .arg(dir.join("clearice.toml"))
        .args(["policy", "check"])
        .output()
        .unwrap();
    let s = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{s}");
    assert!(s.contains("lake.sales.orders: "), "{s}");
    assert!(!s.contains("lake.sales.customers"), "{s}");
}

#[test]
fn principals_see_the_demo_policy() {
    let q = "SELECT ssn FROM lake.sales.customers WHERE id = 1000001";
    let as_user = |u: &str| {
        bin()
            .arg("--config")
            .arg(lake())
            .args(["--user", u, "-q", "--format", "csv", "-c", q])
            .output()
            .unwrap()
    };
    assert_eq!(stdout(&as_user("admin")), "ssn\n609-11-1603\n");
    assert_eq!(stdout(&as_user("analyst")), "ssn\nXXX-XX-1603\n");
    assert_eq!(stdout(&as_user("support")), "ssn\n\"\"\n"); // csv quotes a lone empty field
    let o = as_user("mallory");
    assert_eq!(o.status.code(), Some(4));
    assert!(
        stderr(&o).contains("principal 'mallory' is not a user"),
        "{}",
        stderr(&o)
    );
    let audit = std::fs::read_to_string(lake().parent().unwrap().join("audit.jsonl")).unwrap();
    for u in ["admin", "analyst", "support", "mallory"] {
        assert!(
            audit.contains(&format!("\"user\":\"{u}\"")),
            "no audit record for {u}"
        );
    }
}

/// Runs the default-demo first query with no `USER`/`LOGNAME` (a container's defaults),
/// in a fresh HOME, as `account` (switched to with setpriv) or the current account.
fn first_query_without_user_variables(home: &Path, account: Option<&str>) -> Output {
    let mut c = match account {
        Some(a) => {
            // setpriv changes uid/gid and nothing else: no USER, LOGNAME or HOME is set
            // for the child (runuser and su would set them).
            let setpriv = ["/usr/bin/setpriv", "/bin/setpriv"]
                .into_iter()
                .find(|p| Path::new(p).exists())
                .expect("setpriv (util-linux)");
            let mut c = Command::new(setpriv);
            let groups = if a.parse::<u32>().is_ok() {
                "--clear-groups"
            } else {
                "--init-groups"
            };
            c.args(["--reuid", a, "--regid", a, groups, "--"])
                .arg(env!("CARGO_BIN_EXE_clearice"));
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_clearice")),
    };
    c.env_clear()
        .env("HOME", home)
        .env("PATH", "/usr/bin:/bin")
        .args([
            "-c",
            "SELECT ssn FROM lake.sales.customers WHERE id = 1000001",
        ])
        .output()
        .unwrap()
}

#[test]
fn first_run_without_user_variables_is_the_os_account_and_sees_plaintext() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home-current");
    std::fs::create_dir_all(&home).unwrap();
    let o = first_query_without_user_variables(&home, None);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("609-11-1603"), "{}", stdout(&o));
    // And as a non-root account created for the test (needs root to create it).
    let uid = Command::new("id").arg("-u").output().unwrap();
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        eprintln!("\n*** SKIPPED (non-root part): not running as root ***\n");
        return;
    }
    let account = format!("ci{:06x}", rand_suffix());
    let made = Command::new("useradd")
        .args(["-M", "-s", "/usr/sbin/nologin", &account])
        .status()
        .unwrap();
    assert!(made.success(), "useradd {account}");
    struct Remove(String);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = Command::new("userdel").arg(&self.0).status();
        }
    }
    let _remove = Remove(account.clone());
    let home = Path::new("/tmp").join(format!("clearice-home-{account}"));
    std::fs::create_dir_all(&home).unwrap();
    let chown = Command::new("chown")
        .arg(&account)
        .arg(&home)
        .status()
        .unwrap();
    assert!(chown.success());
    let o = first_query_without_user_variables(&home, Some(&account));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("609-11-1603"), "{}", stdout(&o));
    // A uid with no passwd entry and no USER: one line saying how to pass --user.
    let nobody = "54321";
    let chown = Command::new("chown")
        .arg(nobody)
        .arg(&home)
        .status()
        .unwrap();
    assert!(chown.success());
    let o = first_query_without_user_variables(&home, Some(nobody));
    let _ = std::fs::remove_dir_all(&home);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.lines().count() == 1 && e.contains("cannot tell who you are") && e.contains("--user"),
        "{e}"
    );
}

fn rand_suffix() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
        & 0xff_ffff
}

/// Peak RSS of a child, from `wait4` (per child, unlike RUSAGE_CHILDREN, which other tests'
/// children would contaminate).
#[expect(unsafe_code, reason = "std has no safe wait4 (a child's own peak RSS)")]
fn wait_peak_rss_kib(child: std::process::Child) -> (i32, i64) {
    let pid = child.id() as libc::pid_t;
    std::mem::forget(child); // reaped by wait4 below
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid out-parameter; wait4 fills it for this child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child; pointers are to live locals.
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(rc, pid, "wait4");
    (libc::WEXITSTATUS(status), usage.ru_maxrss)
}

/// Runs `sql` as CSV to a pipe; returns (data lines read, peak RSS in KiB).
fn csv_to_pipe(sql: &str) -> (usize, i64) {
    use std::io::Read;
    let mut child = bin()
        .arg("--config")
        .arg(lake())
        .args(["--user", "admin", "--quiet", "--format", "csv", "-c", sql])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let (mut lines, mut buf) = (0usize, vec![0u8; 1 << 16]);
    loop {
        let n = out.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        lines += buf[..n].iter().filter(|b| **b == b'\n').count();
    }
    let (code, peak_kib) = wait_peak_rss_kib(child);
    assert_eq!(code, 0, "{sql}");
    (lines - 1, peak_kib)
}

#[test]
fn csv_export_of_millions_of_rows_streams_in_bounded_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("big.parquet");
    let o = run(&[
        "--quiet",
        "-c",
        &format!(
            "COPY (SELECT value AS id, value * 2 AS amount, 'customer-' || value AS name, \
             to_timestamp(value) AS ts FROM generate_series(1, 3000000)) TO '{}' \
             STORED AS PARQUET OPTIONS ('format.max_row_group_size' '100000')",
            file.display()
        ),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let sql = format!("SELECT * FROM '{}'", file.display());
    let (rows, peak) = csv_to_pipe(&sql);
    assert_eq!(rows, 3_000_000);
    let (small_rows, small_peak) = csv_to_pipe(&format!("{sql} LIMIT 100000"));
    assert_eq!(small_rows, 100_000);
    eprintln!(
        "csv export to a pipe: 3M rows peak RSS {} MiB, 100k rows {} MiB",
        peak / 1024,
        small_peak / 1024
    );
    // Bounded: 30x the rows costs (almost) no more memory, and stays under 192 MiB (a
    // debug binary on mimalloc starts at ~144 MiB here; the 3M rows alone are ~120 MiB of
    // Arrow, so a buffered result would not fit).
    assert!(peak < 192 * 1024, "peak RSS {} MiB", peak / 1024);
    assert!(
        peak - small_peak < 24 * 1024,
        "RSS grows with rows: {} KiB more for 30x the rows",
        peak - small_peak
    );
}

/// An error that quotes a protected value reaches the user whole, but the audit record
/// keeps it without the value (the class and the names it carries stay).
#[test]
fn audit_errors_do_not_keep_the_values_they_quote() {
    let ssn = stdout(&run(&[
        "--format",
        "csv",
        "-c",
        "SELECT ssn FROM lake.sales.customers WHERE id = 1000000",
    ]))
    .lines()
    .nth(1)
    .unwrap()
    .to_owned();
    let o = run(&[
        "-c",
        "SELECT CAST(ssn AS INT) FROM lake.sales.customers WHERE id = 1000000",
    ]);
    assert!(stderr(&o).contains(&ssn), "{}", stderr(&o));
    let audit = std::fs::read_to_string(lake().parent().unwrap().join("audit.jsonl")).unwrap();
    let record = audit
        .lines()
        .rfind(|l| l.contains("Cannot cast string"))
        .expect("audit record of the failed cast");
    assert!(!record.contains(&ssn), "{record}");
    assert!(record.contains("Cannot cast string '…'"), "{record}");
}
