//! Helpers shared by the CLI's integration tests: the binary, its processes, the test venv.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The test venv's python (`CLEARICE_PYTHON`), from the workspace's test support.
pub use clearice_testkit::python;

/// A child process killed (and resumed first, if frozen) when dropped.
pub struct Proc {
    /// The process.
    pub child: Child,
    /// The address it listens on.
    pub addr: String,
}

impl Drop for Proc {
    fn drop(&mut self) {
        signal(&self.child, libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `sig` to our own child.
pub fn signal(child: &Child, sig: i32) {
    // SAFETY: signalling a child this test started (and has not reaped).
    #[expect(unsafe_code, reason = "std has no safe call to send a signal")]
    unsafe {
        libc::kill(child.id() as i32, sig);
    }
}

/// Starts `clearice --config CONFIG ARGS --addr 127.0.0.1:0 --addr-file F` and waits
/// until it listens.
pub fn start(config: &Path, args: &[&str], addr_file: &Path) -> Proc {
    let _ = std::fs::remove_file(addr_file);
    let child = Command::new(env!("CARGO_BIN_EXE_clearice"))
        .arg("--config")
        .arg(config)
        .args(args)
        .args(["--addr", "127.0.0.1:0", "--addr-file"])
        .arg(addr_file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while std::fs::read_to_string(addr_file)
        .unwrap_or_default()
        .is_empty()
    {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{args:?} did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Proc {
        child,
        addr: std::fs::read_to_string(addr_file).unwrap(),
    }
}

/// `clearice demo init DIR/lake`: the demo lake (config, policy, keyring, tables) in `dir`;
/// its path.
pub fn demo_lake(dir: &Path) -> PathBuf {
    let lake = dir.join("lake");
    run_ok(
        Command::new(env!("CARGO_BIN_EXE_clearice"))
            .args(["demo", "init"])
            .arg(&lake),
    );
    lake
}

/// Runs `cmd` to completion; it must succeed (its stderr is the failure message).
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// GETs `path` from `addr` (host:port) over plaintext HTTP/1.1 with `headers`; returns the
/// status and the body (chunked bodies decoded).
pub fn http_get(addr: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase()
            .starts_with("transfer-encoding: chunked")
    });
    if !chunked {
        return (status, body.to_owned());
    }
    let (mut rest, mut out) = (body, String::new());
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&after[..n]);
        rest = &after[n + 2..];
    }
    (status, out)
}
