//! Who runs the process: the OS account of the effective uid, from the system's user
//! database (passwd, including NSS sources such as LDAP), not only `$USER` (unset in
//! containers and CI).

/// Where the principal of a local session came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrincipalSource {
    /// `--user NAME`.
    Flag,
    /// `CLEARICE_USER`.
    Env,
    /// The OS account of the effective uid.
    OsAccount,
    /// `$USER`/`$LOGNAME`: the uid has no entry in the user database.
    UserVariable,
}

impl std::fmt::Display for PrincipalSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PrincipalSource::Flag => "--user",
            PrincipalSource::Env => "CLEARICE_USER",
            PrincipalSource::OsAccount => "the OS account",
            PrincipalSource::UserVariable => "$USER",
        })
    }
}

/// The account name of the effective uid, from the user database.
#[cfg(unix)]
pub fn os_account() -> Option<String> {
    let uid = effective_uid();
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: getpwuid_r writes into `pwd` and `buf` (whose length we pass) and sets
    // `result` to `&pwd` on success or null; `pw_name` then points into `buf`, which
    // outlives its use here.
    #[expect(unsafe_code, reason = "the user database has no safe binding in std")]
    unsafe {
        let mut pwd: libc::passwd = std::mem::zeroed();
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwuid_r(
            uid,
            &mut pwd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        );
        if rc != 0 || result.is_null() || pwd.pw_name.is_null() {
            return None;
        }
        let name = std::ffi::CStr::from_ptr(pwd.pw_name)
            .to_string_lossy()
            .into_owned();
        (!name.is_empty()).then_some(name)
    }
}

/// The effective uid.
#[cfg(unix)]
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    #[expect(unsafe_code, reason = "std has no safe binding for the effective uid")]
    unsafe {
        libc::geteuid()
    }
}

/// The account name of the effective uid (not on Unix: none).
#[cfg(not(unix))]
pub fn os_account() -> Option<String> {
    None
}

/// The local principal when no `--user`/`CLEARICE_USER` is given: the OS account, else
/// `$USER`/`$LOGNAME` (a uid without a passwd entry, as in some containers).
pub fn default_principal() -> Option<(String, PrincipalSource)> {
    if let Some(name) = os_account() {
        return Some((name, PrincipalSource::OsAccount));
    }
    ["USER", "LOGNAME"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .find(|v| !v.is_empty())
        .map(|v| (v, PrincipalSource::UserVariable))
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests may block")]
mod tests {
    #[cfg(unix)]
    #[test]
    fn the_os_account_is_found_without_user_variables() {
        // The test process's own uid has a passwd entry on any machine that runs CI.
        let name = super::os_account().expect("passwd entry of the effective uid");
        assert!(!name.is_empty());
        if super::effective_uid() == 0 {
            assert_eq!(name, "root");
        }
    }
}
