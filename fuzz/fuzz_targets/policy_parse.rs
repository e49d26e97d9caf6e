//! The policy parser (`clearice_policy::Policy::parse`) on arbitrary text. Nothing may
//! panic; a policy that parses answers decisions for any principal, table and column.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(p) = clearice_policy::Policy::parse(text, "fuzz") {
        for user in ["admin", "analyst", "nobody"] {
            for (table, t) in p.tables() {
                let _ = p.table_access(user, table);
                for column in t.columns.keys() {
                    let _ = p.decide(user, table, column);
                }
            }
        }
    }
});
