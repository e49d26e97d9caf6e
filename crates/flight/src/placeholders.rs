//! JDBC-style `?` placeholders. DataFusion numbers only `$1..$n`; every `?` would be the
//! same parameter. Statements are rewritten before planning: the n-th `?` outside string
//! literals, quoted identifiers and comments becomes `$n`.

use std::borrow::Cow;

use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

/// `sql` with its `?` placeholders numbered `$1..$n`. Unchanged when it has none, when it
/// already uses `$n` placeholders (mixing both is left to the planner), or when it does not
/// tokenize (the planner then reports the syntax error).
pub fn number_question_marks(sql: &str) -> Cow<'_, str> {
    if !sql.contains('?') {
        return Cow::Borrowed(sql);
    }
    let Ok(tokens) = Tokenizer::new(&GenericDialect {}, sql).tokenize_with_location() else {
        return Cow::Borrowed(sql);
    };
    let placeholders: Vec<_> = tokens
        .iter()
        .filter_map(|t| match &t.token {
            Token::Placeholder(p) => Some((p.as_str(), t.span.start)),
            _ => None,
        })
        .collect();
    if placeholders.iter().any(|(p, _)| p.starts_with('$'))
        || !placeholders.iter().any(|(p, _)| *p == "?")
    {
        return Cow::Borrowed(sql);
    }
    // Byte offset of each line start (locations are 1-based lines and char columns).
    let line_starts: Vec<usize> = std::iter::once(0)
        .chain(sql.match_indices('\n').map(|(i, _)| i + 1))
        .collect();
    let mut out = String::with_capacity(sql.len() + placeholders.len() * 2);
    let mut copied = 0;
    let mut n = 0;
    for (p, loc) in placeholders {
        if p != "?" {
            continue;
        }
        let Some(line_start) = line_starts.get(loc.line as usize - 1) else {
            return Cow::Borrowed(sql);
        };
        let Some((offset, _)) = sql[*line_start..]
            .char_indices()
            .nth(loc.column as usize - 1)
            .map(|(i, c)| (line_start + i, c))
            .filter(|(_, c)| *c == '?')
        else {
            return Cow::Borrowed(sql);
        };
        n += 1;
        out.push_str(&sql[copied..offset]);
        out.push_str(&format!("${n}"));
        copied = offset + 1;
    }
    out.push_str(&sql[copied..]);
    Cow::Owned(out)
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests may block")]
mod tests {
    use super::number_question_marks as n;

    #[test]
    fn numbers_question_marks_outside_literals_and_comments() {
        assert_eq!(
            n("SELECT 'a?b', \"c?\" FROM t -- why?\nWHERE x = ? AND y IN (?, ?)"),
            "SELECT 'a?b', \"c?\" FROM t -- why?\nWHERE x = $1 AND y IN ($2, $3)"
        );
        assert_eq!(
            n("SELECT 'it''s ?' WHERE é = ?"),
            "SELECT 'it''s ?' WHERE é = $1"
        );
    }

    #[test]
    fn leaves_other_statements_alone() {
        assert_eq!(n("SELECT 1"), "SELECT 1");
        assert_eq!(n("SELECT $1, '?'"), "SELECT $1, '?'");
        assert_eq!(n("SELECT ? , $1"), "SELECT ? , $1");
    }
}
