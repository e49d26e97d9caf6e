//! Error messages kept for audit, with the values they may quote removed.
//!
//! A failed statement's message can quote the data it failed on (`Cannot cast string
//! '794-67-9900' to value of Int32 type`, `Overflow happened on: 912345 * 1000`): the
//! audit log keeps the error's class and a message in which every quoted text that is
//! not a name the record already carries (its table, columns, principal) and every
//! number of four digits or more is replaced by `…`. The user who ran the statement
//! still gets the whole message.

use std::collections::BTreeSet;

/// What a quoted text or a long number becomes.
const REDACTED: &str = "…";

/// `message` with quoted texts other than `known` names, and numbers of four or more
/// digits, replaced by `…`.
pub fn redact_values(message: &str, known: &BTreeSet<&str>) -> String {
    let chars: Vec<char> = message.chars().collect();
    let mut out = String::with_capacity(message.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\'' || c == '"' || c == '`' {
            // A quoted text runs to the same quote (SQL's doubled quote inside it).
            let mut j = i + 1;
            let mut text = String::new();
            let mut closed = false;
            while j < chars.len() {
                if chars[j] == c {
                    if chars.get(j + 1) == Some(&c) {
                        text.push(c);
                        j += 2;
                        continue;
                    }
                    closed = true;
                    break;
                }
                text.push(chars[j]);
                j += 1;
            }
            out.push(c);
            if closed && (text.is_empty() || known.contains(text.as_str())) {
                out.push_str(&text);
            } else {
                out.push_str(REDACTED);
            }
            if closed {
                out.push(c);
            }
            i = j + 1;
            continue;
        }
        let after_word = i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
        if c.is_ascii_digit() && !after_word {
            let mut j = i;
            while j < chars.len() && (chars[j].is_ascii_digit() || chars[j] == '.') {
                j += 1;
            }
            let run: String = chars[i..j].iter().collect();
            let digits = run.chars().filter(char::is_ascii_digit).count();
            let glued = chars
                .get(j)
                .is_some_and(|n| n.is_alphanumeric() || *n == '_');
            if digits >= 4 && !glued {
                out.push_str(REDACTED);
            } else {
                out.push_str(&run);
            }
            i = j;
            continue;
        }
        out.push(c);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_values_are_redacted_and_known_names_kept() {
        let known: BTreeSet<&str> = ["lake.sales.people", "ssn"].into();
        let got = redact_values(
            "Arrow error: Cast error: Cannot cast string '794-67-9900' to value of Int32 type (table 'lake.sales.people', column 'ssn')",
            &known,
        );
        assert!(!got.contains("794"), "{got}");
        assert!(
            got.contains("'lake.sales.people'") && got.contains("'ssn'"),
            "{got}"
        );
        assert!(got.contains("Cannot cast string '…'"), "{got}");
    }

    #[test]
    fn long_numbers_are_redacted_short_ones_kept() {
        let got = redact_values(
            "Overflow happened on: 912345 * 1000 in row group 3 of part-00012.parquet, 12.75, 2.5",
            &BTreeSet::new(),
        );
        assert!(!got.contains("912345") && !got.contains("1000"), "{got}");
        assert!(
            got.contains("row group 3") && got.contains("part-00012"),
            "{got}"
        );
        assert!(!got.contains("12.75") && got.ends_with(", 2.5"), "{got}");
    }

    #[test]
    fn unterminated_and_doubled_quotes_do_not_leak() {
        let got = redact_values("bad value 'it''s 555-12 and more", &BTreeSet::new());
        assert!(!got.contains("555") && !got.contains("it"), "{got}");
        let got = redact_values("value \"Ann \"\"Smith\"\"\" rejected", &BTreeSet::new());
        assert!(
            !got.contains("Smith") && got.ends_with(" rejected"),
            "{got}"
        );
    }
}
