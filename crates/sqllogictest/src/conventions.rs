//! DataFusion's sqllogictest conventions, so `.slt` files written for DataFusion's own
//! runner (`datafusion-sqllogictest` 53.1) run unchanged: how values are printed (floats
//! and decimals rounded to 12 places and normalized, `NULL`, `(empty)`, booleans as
//! `true`/`false`, NaN and infinities spelled out), multi-line values expanded into
//! numbered rows (EXPLAIN plans), paths under the workspace root printed as
//! `WORKSPACE_ROOT`, column type letters (`B D I P R T ?`), trailing whitespace ignored,
//! and `<slt:ignore>` fragments in expected output.
//!
//! Ported from Apache DataFusion's `datafusion/sqllogictest/src/engines` (Apache-2.0).

use bigdecimal::BigDecimal;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{
    DataType, Decimal128Type, Decimal256Type, DecimalType, Fields, Float16Type, Float32Type,
    Float64Type,
};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use std::str::FromStr;

/// How NULL prints.
pub const NULL_STR: &str = "NULL";

/// Column type letters as DataFusion's runner checks them.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum ColumnType {
    /// `B`
    Boolean,
    /// `D`: dates and times of day.
    DateTime,
    /// `I`
    Integer,
    /// `R`: floats and decimals.
    Float,
    /// `T`
    Text,
    /// `P`
    Timestamp,
    /// `?`: anything else.
    Another,
}

impl sqllogictest::ColumnType for ColumnType {
    fn from_char(value: char) -> Option<Self> {
        Some(match value {
            'B' => Self::Boolean,
            'D' => Self::DateTime,
            'I' => Self::Integer,
            'P' => Self::Timestamp,
            'R' => Self::Float,
            'T' => Self::Text,
            _ => Self::Another,
        })
    }

    fn to_char(&self) -> char {
        match self {
            Self::Boolean => 'B',
            Self::DateTime => 'D',
            Self::Integer => 'I',
            Self::Timestamp => 'P',
            Self::Float => 'R',
            Self::Text => 'T',
            Self::Another => '?',
        }
    }
}

/// The type letters of a result's columns.
pub fn column_types(fields: &Fields) -> Vec<ColumnType> {
    fields.iter().map(|f| column_type(f.data_type())).collect()
}

fn column_type(dt: &DataType) -> ColumnType {
    match dt {
        DataType::Boolean => ColumnType::Boolean,
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64 => ColumnType::Integer,
        DataType::Float16
        | DataType::Float32
        | DataType::Float64
        | DataType::Decimal128(..)
        | DataType::Decimal256(..) => ColumnType::Float,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => ColumnType::Text,
        DataType::Date32 | DataType::Date64 | DataType::Time32(_) | DataType::Time64(_) => {
            ColumnType::DateTime
        }
        DataType::Timestamp(..) => ColumnType::Timestamp,
        DataType::Dictionary(key, value)
            if key.is_integer()
                && matches!(
                    value.as_ref(),
                    DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
                ) =>
        {
            ColumnType::Text
        }
        _ => ColumnType::Another,
    }
}

/// Renders batches as rows of cells; a multi-line last cell (an EXPLAIN plan) becomes
/// numbered rows, and `workspace_root` (when given) prints as `WORKSPACE_ROOT`.
pub fn rows(
    batches: &[RecordBatch],
    workspace_root: Option<&str>,
) -> Result<Vec<Vec<String>>, ArrowError> {
    let mut out = Vec::new();
    for batch in batches {
        for row in 0..batch.num_rows() {
            let cells = batch
                .columns()
                .iter()
                .map(|c| cell(c, row))
                .collect::<Result<Vec<_>, _>>()?;
            for mut r in expand_row(cells) {
                if let Some(root) = workspace_root {
                    for s in &mut r {
                        if s.contains(root) {
                            *s = s.replace(root, "WORKSPACE_ROOT");
                        }
                    }
                }
                out.push(r);
            }
        }
    }
    Ok(out)
}

fn expand_row(mut row: Vec<String>) -> Vec<Vec<String>> {
    let Some(last) = row.pop() else {
        return vec![row];
    };
    let lines: Vec<&str> = last.split('\n').collect();
    if lines.len() < 2 {
        row.push(last);
        return vec![row];
    }
    let mut out = vec![row];
    for (i, l) in lines.iter().enumerate() {
        // Leading spaces become '-': sqllogictest ignores whitespace differences.
        let content = l.trim_start();
        let prefix = "-".repeat(l.len() - content.len());
        out.push(vec![format!("{:02}){prefix}{content}", i + 1)]);
    }
    out
}

/// One cell as DataFusion's runner prints it.
pub fn cell(col: &ArrayRef, row: usize) -> Result<String, ArrowError> {
    if col.is_null(row) {
        return Ok(NULL_STR.to_owned());
    }
    Ok(match col.data_type() {
        DataType::Null => NULL_STR.to_owned(),
        DataType::Boolean => col.as_boolean().value(row).to_string(),
        DataType::Float16 => {
            let v = col.as_primitive::<Float16Type>().value(row);
            float_to_str(
                v.is_nan(),
                v.is_infinite(),
                v.is_sign_negative(),
                &v.to_string(),
            )
        }
        DataType::Float32 => {
            let v = col.as_primitive::<Float32Type>().value(row);
            float_to_str(v.is_nan(), v.is_infinite(), v < 0.0, &v.to_string())
        }
        DataType::Float64 => {
            let v = col.as_primitive::<Float64Type>().value(row);
            float_to_str(v.is_nan(), v.is_infinite(), v < 0.0, &v.to_string())
        }
        DataType::Decimal128(_, scale) => {
            let v = col.as_primitive::<Decimal128Type>().value(row);
            decimal_str(&Decimal128Type::format_decimal(v, u8::MAX, *scale))
        }
        DataType::Decimal256(_, scale) => {
            let v = col.as_primitive::<Decimal256Type>().value(row);
            decimal_str(&Decimal256Type::format_decimal(v, u8::MAX, *scale))
        }
        DataType::Utf8 => varchar(col.as_string::<i32>().value(row)),
        DataType::LargeUtf8 => varchar(col.as_string::<i64>().value(row)),
        DataType::Utf8View => varchar(col.as_string_view().value(row)),
        DataType::Dictionary(..) => {
            let dict = col.as_any_dictionary();
            let key = dict.normalized_keys()[row];
            cell(dict.values(), key)?
        }
        _ => ArrayFormatter::try_new(col.as_ref(), &format_options())?
            .value(row)
            .to_string(),
    })
}

/// DataFusion's display options (durations print `pretty`, not ISO 8601), NULL as `NULL`.
fn format_options() -> FormatOptions<'static> {
    static OPTIONS: std::sync::LazyLock<datafusion::config::FormatOptions> =
        std::sync::LazyLock::new(|| datafusion::config::FormatOptions {
            null: NULL_STR.to_owned(),
            ..Default::default()
        });
    (&*OPTIONS).try_into().unwrap_or_default()
}

fn varchar(v: &str) -> String {
    if v.is_empty() {
        "(empty)".to_owned()
    } else {
        // NUL escaped so that output files stay text.
        v.trim_end_matches('\n').replace('\u{0000}', "\\0")
    }
}

fn float_to_str(nan: bool, infinite: bool, negative: bool, text: &str) -> String {
    match (nan, infinite, negative) {
        // The sign of NaN differs between platforms.
        (true, _, _) => "NaN".to_owned(),
        (_, true, false) => "Infinity".to_owned(),
        (_, true, true) => "-Infinity".to_owned(),
        _ => decimal_str(text),
    }
}

/// Rounds to 12 decimal places and drops trailing zeros (`0.110` → `0.11`).
fn decimal_str(text: &str) -> String {
    match BigDecimal::from_str(text) {
        Ok(v) => v.round(12).normalized().to_plain_string(),
        Err(_) => text.to_owned(),
    }
}

/// Trailing whitespace of expected lines is not significant.
#[expect(clippy::ptr_arg, reason = "sqllogictest's Normalizer signature")]
pub fn normalizer(s: &String) -> String {
    s.trim_end().to_owned()
}

/// Compares actual rows with expected lines; `<slt:ignore>` in the expected text matches
/// any fragment of the actual output.
pub fn validator(
    normalize: sqllogictest::Normalizer,
    actual: &[Vec<String>],
    expected: &[String],
) -> bool {
    const IGNORE: &str = "<slt:ignore>";
    let expected: Vec<String> = expected.iter().map(normalize).collect();
    let actual: Vec<String> = actual
        .iter()
        .map(|r| r.join(" ").trim_end().to_owned())
        .collect();
    if !expected.iter().any(|l| l.contains(IGNORE)) {
        return actual == expected;
    }
    let (expected, actual) = (expected.join("\n"), actual.join("\n"));
    let mut pos = 0;
    for (i, frag) in expected.split(IGNORE).enumerate() {
        if frag.is_empty() {
            continue;
        }
        match actual[pos..].find(frag) {
            // Text before the first marker must start the output.
            Some(idx) if i == 0 && idx != 0 => return false,
            Some(idx) => pos += idx + frag.len(),
            None => return false,
        }
    }
    true
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests may block")]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{Decimal128Array, Float64Array, StringArray};

    use super::*;

    fn first(a: ArrayRef) -> String {
        cell(&a, 0).unwrap()
    }

    #[test]
    fn numbers_print_as_datafusion_prints_them() {
        let f = |v: f64| first(Arc::new(Float64Array::from(vec![v])));
        assert_eq!(f(1.0), "1");
        assert_eq!(f(0.1 + 0.2), "0.3");
        assert_eq!(f(-2.5), "-2.5");
        assert_eq!(f(f64::NAN), "NaN");
        assert_eq!(f(f64::NEG_INFINITY), "-Infinity");
        let d = Decimal128Array::from(vec![110_i128])
            .with_precision_and_scale(10, 3)
            .unwrap();
        assert_eq!(first(Arc::new(d)), "0.11");
        let s = StringArray::from(vec![Some(""), None, Some("a\n")]);
        let s: ArrayRef = Arc::new(s);
        assert_eq!(
            [
                cell(&s, 0).unwrap(),
                cell(&s, 1).unwrap(),
                cell(&s, 2).unwrap()
            ],
            ["(empty)", "NULL", "a"]
        );
    }

    #[test]
    fn multi_line_cells_become_numbered_rows() {
        let rows = expand_row(vec!["plan".into(), "A\n  B".into()]);
        assert_eq!(rows, vec![vec!["plan"], vec!["01)A"], vec!["02)--B"]]);
    }

    #[test]
    fn ignore_marker_matches_fragments_but_not_a_leading_gap() {
        let actual = vec![vec!["foo bar baz".to_owned()]];
        assert!(validator(normalizer, &actual, &["foo <slt:ignore>".into()]));
        assert!(validator(normalizer, &actual, &["<slt:ignore> baz".into()]));
        assert!(!validator(
            normalizer,
            &actual,
            &["bar <slt:ignore>".into()]
        ));
        assert!(!validator(normalizer, &actual, &["foo bar".into()]));
    }
}
