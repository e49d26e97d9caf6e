//! The Iceberg REST spec's column actions ([`CatalogMask`]) with the spec's exact
//! semantics, so a column a REST catalog restricts reads the same in ClearIce as in any
//! engine that implements the spec: each keeps the column's type, and NULL stays NULL.

use std::sync::Arc;

use clearice_policy::CatalogMask;
use datafusion::arrow::array::builder::NullBufferBuilder;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, BinaryArray, Int32Array, Int64Array};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::compute::{cast, is_null, nullif};
use datafusion::arrow::datatypes::{DataType, Int32Type, Int64Type, TimeUnit};
use datafusion::error::{DataFusionError, Result};
use datafusion::scalar::ScalarValue;

use super::Hash;

/// Days from 1970-01-01 to 9999-12-31, the spec's default date.
const DEFAULT_DAYS: i64 = 2_932_896;
/// Days from 1970-01-01 to 2261-12-31, the spec's default for nanosecond timestamps.
const DEFAULT_DAYS_NS: i64 = 106_650;
/// The spec's default integer.
const DEFAULT_INT: i64 = 999_999_999;

fn is_string(dt: &DataType) -> bool {
    match dt {
        DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8 => true,
        DataType::Dictionary(_, v) => is_string(v),
        _ => false,
    }
}

/// Checks at plan time that `mask` applies to a column of type `dt`.
pub(super) fn check(mask: CatalogMask, column: &str, dt: &DataType) -> Result<()> {
    let ok = match mask {
        CatalogMask::MaskAlphanum | CatalogMask::ShowFirst4 | CatalogMask::ShowLast4 => {
            is_string(dt)
        }
        CatalogMask::MaskToDefault => default_value(dt).is_ok(),
        CatalogMask::Sha256Global => {
            is_string(dt)
                || matches!(
                    dt,
                    DataType::Int32 | DataType::Int64 | DataType::Binary | DataType::LargeBinary
                )
        }
    };
    if ok {
        Ok(())
    } else {
        Err(DataFusionError::Plan(format!(
            "the catalog's read restriction '{}' cannot apply to column '{column}' of type {dt}",
            mask.name()
        )))
    }
}

/// Applies `mask` to the decrypted column `input`.
pub(super) fn apply(
    mask: CatalogMask,
    input: Option<&ArrayRef>,
    dt: &DataType,
    len: usize,
) -> Result<ArrayRef> {
    let input = || {
        input.ok_or_else(|| {
            DataFusionError::Internal(format!("mask {} needs its column", mask.name()))
        })
    };
    match mask {
        CatalogMask::MaskToDefault => {
            let default = default_value(dt)?.to_array_of_size(len)?;
            Ok(nullif(&default, &is_null(input()?)?)?)
        }
        CatalogMask::MaskAlphanum => alphanum(input()?, Keep::None),
        CatalogMask::ShowFirst4 => alphanum(input()?, Keep::First4),
        CatalogMask::ShowLast4 => alphanum(input()?, Keep::Last4),
        CatalogMask::Sha256Global => sha256_global(input()?),
    }
}

/// The spec's `mask-to-default` value of a type.
fn default_value(dt: &DataType) -> Result<ScalarValue> {
    let days = |d: i64, per_day: i64| d * per_day;
    Ok(match dt {
        DataType::Boolean => ScalarValue::Boolean(Some(false)),
        DataType::Int32 => ScalarValue::Int32(Some(DEFAULT_INT as i32)),
        DataType::Int64 => ScalarValue::Int64(Some(DEFAULT_INT)),
        DataType::Float32 => ScalarValue::Float32(Some(0.0)),
        DataType::Float64 => ScalarValue::Float64(Some(0.0)),
        DataType::Decimal128(p, s) => ScalarValue::Decimal128(Some(0), *p, *s),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            ScalarValue::try_from_string("XXXXXXXX".into(), dt)?
        }
        DataType::Date32 => ScalarValue::Date32(Some(DEFAULT_DAYS as i32)),
        DataType::Time64(TimeUnit::Microsecond) => ScalarValue::Time64Microsecond(Some(0)),
        DataType::Timestamp(unit, tz) => {
            let v = match unit {
                TimeUnit::Second => days(DEFAULT_DAYS, 86_400),
                TimeUnit::Millisecond => days(DEFAULT_DAYS, 86_400_000),
                TimeUnit::Microsecond => days(DEFAULT_DAYS, 86_400_000_000),
                TimeUnit::Nanosecond => days(DEFAULT_DAYS_NS, 86_400_000_000_000),
            };
            let tz = tz.clone();
            match unit {
                TimeUnit::Second => ScalarValue::TimestampSecond(Some(v), tz),
                TimeUnit::Millisecond => ScalarValue::TimestampMillisecond(Some(v), tz),
                TimeUnit::Microsecond => ScalarValue::TimestampMicrosecond(Some(v), tz),
                TimeUnit::Nanosecond => ScalarValue::TimestampNanosecond(Some(v), tz),
            }
        }
        DataType::FixedSizeBinary(n) => {
            ScalarValue::FixedSizeBinary(*n, Some(vec![0; usize::try_from(*n).unwrap_or(0)]))
        }
        DataType::Binary => ScalarValue::Binary(Some(Vec::new())),
        DataType::LargeBinary => ScalarValue::LargeBinary(Some(Vec::new())),
        DataType::Dictionary(k, v) => {
            ScalarValue::Dictionary(k.clone(), Box::new(default_value(v)?))
        }
        // An empty list, not a NULL one.
        DataType::List(_) => ScalarValue::try_from_array(&super::fixed_default(dt, 1)?, 0)?,
        other => {
            return Err(DataFusionError::Plan(format!(
                "mask-to-default of type {other} is not implemented in ClearIce"
            )));
        }
    })
}

#[derive(Clone, Copy)]
enum Keep {
    None,
    First4,
    Last4,
}

/// The spec's `mask-alphanum` rule for one code point.
fn alphanum_char(c: char) -> char {
    match c {
        '0'..='9' => 'n',
        '(' | ')' | ',' | '.' | '-' | '@' => c,
        _ => 'x',
    }
}

/// Appends `s` masked, keeping 4 code points at one end if `keep` says so (values of 4
/// code points or fewer unchanged).
fn alphanum_into(s: &str, keep: Keep, out: &mut String) {
    let n = s.chars().count();
    out.extend(s.chars().enumerate().map(|(i, c)| {
        let kept = match keep {
            Keep::None => false,
            Keep::First4 => i < 4,
            Keep::Last4 => i + 4 >= n,
        };
        if kept { c } else { alphanum_char(c) }
    }));
}

fn alphanum(a: &ArrayRef, keep: Keep) -> Result<ArrayRef> {
    match a.data_type() {
        DataType::Dictionary(_, _) => {
            let dict = a.as_any_dictionary();
            Ok(dict.with_values(alphanum(dict.values(), keep)?))
        }
        DataType::Utf8 => Ok(Arc::new(super::map_strings(
            a.as_string::<i32>(),
            |v, out| alphanum_into(v, keep, out),
        ))),
        dt => {
            let s = cast(a, &DataType::Utf8)?;
            Ok(cast(&alphanum(&s, keep)?, dt)?)
        }
    }
}

/// The 32 bytes of a SHA-256 digest.
fn digest_bytes(v: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (o, w) in out.chunks_exact_mut(4).zip(Hash::Plain.digest(v)) {
        o.copy_from_slice(&w.to_be_bytes());
    }
    out
}

fn sha256_global(a: &ArrayRef) -> Result<ArrayRef> {
    let first = |d: [u8; 32], n: usize| {
        let mut b = [0u8; 8];
        b[..n].copy_from_slice(&d[..n]);
        b
    };
    Ok(match a.data_type() {
        DataType::Dictionary(_, _) => {
            let dict = a.as_any_dictionary();
            dict.with_values(sha256_global(dict.values())?)
        }
        DataType::Int32 => {
            let v = a.as_primitive::<Int32Type>();
            let out: Int32Array = v.unary(|x| {
                let b = first(digest_bytes(&x.to_le_bytes()), 4);
                i32::from_le_bytes([b[0], b[1], b[2], b[3]])
            });
            Arc::new(out)
        }
        DataType::Int64 => {
            let v = a.as_primitive::<Int64Type>();
            let out: Int64Array =
                v.unary(|x| i64::from_le_bytes(first(digest_bytes(&x.to_le_bytes()), 8)));
            Arc::new(out)
        }
        DataType::Binary => {
            let v = a.as_binary::<i32>();
            let mut bytes = Vec::with_capacity(v.len() * 32);
            let mut offsets = Vec::with_capacity(v.len() + 1);
            offsets.push(0i32);
            let mut nulls = NullBufferBuilder::new(v.len());
            for x in v.iter() {
                match x {
                    Some(x) => {
                        bytes.extend_from_slice(&digest_bytes(x));
                        nulls.append_non_null();
                    }
                    None => nulls.append_null(),
                }
                offsets.push(i32::try_from(bytes.len()).map_err(|_| {
                    DataFusionError::ResourcesExhausted(
                        "sha-256-global mask: batch too large".into(),
                    )
                })?);
            }
            Arc::new(BinaryArray::new(
                OffsetBuffer::new(offsets.into()),
                bytes.into(),
                nulls.finish(),
            ))
        }
        DataType::LargeBinary => {
            let b = cast(a, &DataType::Binary)?;
            cast(&sha256_global(&b)?, &DataType::LargeBinary)?
        }
        // Text: the lower-case hex digest of the UTF-8 bytes, in the column's string type.
        dt => cast(&super::hash(a, &Hash::Plain)?, dt)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{DictionaryArray, StringArray};
    use datafusion::arrow::datatypes::Int8Type;
    use sha2::{Digest, Sha256};

    fn strings(mask: CatalogMask, values: &[Option<&str>]) -> Vec<Option<String>> {
        let a: ArrayRef = Arc::new(StringArray::from(values.to_vec()));
        let out = apply(mask, Some(&a), a.data_type(), a.len()).unwrap();
        out.as_string::<i32>()
            .iter()
            .map(|v| v.map(str::to_owned))
            .collect()
    }

    /// The spec's own examples.
    #[test]
    fn alphanum_masks_match_the_spec_examples() {
        let e = Some("prashant010696@gmail.com");
        assert_eq!(
            strings(CatalogMask::MaskAlphanum, &[e, None]),
            [Some("xxxxxxxxnnnnnn@xxxxx.xxx".to_owned()), None]
        );
        assert_eq!(
            strings(CatalogMask::ShowFirst4, &[e]),
            [Some("prasxxxxnnnnnn@xxxxx.xxx".to_owned())]
        );
        assert_eq!(
            strings(CatalogMask::ShowLast4, &[Some("4111-1111-1111-4444")]),
            [Some("nnnn-nnnn-nnnn-4444".to_owned())]
        );
        // Code points, not bytes; 4 or fewer unchanged; other punctuation and spaces: x.
        assert_eq!(
            strings(
                CatalogMask::ShowLast4,
                &[Some("Zoë Ñandú"), Some("Zoë"), Some("a b_c/1")]
            ),
            [
                Some("xxxxxandú".to_owned()),
                Some("Zoë".to_owned()),
                Some("xxx_c/1".to_owned())
            ]
        );
        assert_eq!(
            strings(CatalogMask::MaskAlphanum, &[Some("(0),.-@ é")]),
            [Some("(n),.-@xx".to_owned())]
        );
    }

    #[test]
    fn dictionary_columns_keep_their_type() {
        let d: DictionaryArray<Int8Type> = vec!["DE", "FR", "DE"].into_iter().collect();
        let a: ArrayRef = Arc::new(d);
        let out = apply(CatalogMask::MaskAlphanum, Some(&a), a.data_type(), 3).unwrap();
        assert_eq!(out.data_type(), a.data_type());
        let s = cast(&out, &DataType::Utf8).unwrap();
        assert_eq!(s.as_string::<i32>().value(1), "xx");
    }

    #[test]
    fn sha256_global_follows_the_spec_encodings() {
        let a: ArrayRef = Arc::new(Int64Array::from(vec![Some(7), None]));
        let out = apply(CatalogMask::Sha256Global, Some(&a), a.data_type(), 2).unwrap();
        let d = Sha256::digest(7i64.to_le_bytes());
        let want = i64::from_le_bytes(d[..8].try_into().unwrap());
        let out = out.as_primitive::<Int64Type>();
        assert_eq!(out.value(0), want);
        assert!(out.is_null(1));
        let a: ArrayRef = Arc::new(Int32Array::from(vec![-1]));
        let out = apply(CatalogMask::Sha256Global, Some(&a), a.data_type(), 1).unwrap();
        let d = Sha256::digest((-1i32).to_le_bytes());
        assert_eq!(
            out.as_primitive::<Int32Type>().value(0),
            i32::from_le_bytes(d[..4].try_into().unwrap())
        );
        let s = strings(CatalogMask::Sha256Global, &[Some("abc")]);
        assert_eq!(
            s[0].as_deref(),
            Some(hex::encode(Sha256::digest(b"abc")).as_str())
        );
        let a: ArrayRef = Arc::new(BinaryArray::from(vec![Some(&b"abc"[..])]));
        let out = apply(CatalogMask::Sha256Global, Some(&a), a.data_type(), 1).unwrap();
        assert_eq!(
            out.as_binary::<i32>().value(0),
            Sha256::digest(b"abc").as_slice()
        );
    }

    #[test]
    fn mask_to_default_gives_the_spec_values() {
        // Any value gives the default; NULL stays NULL.
        let v = |dt: DataType| {
            let some = ScalarValue::try_from(&dt).unwrap();
            let some = default_value(&dt)
                .unwrap_or(some)
                .to_array_of_size(1)
                .unwrap();
            let null = datafusion::arrow::array::new_null_array(&dt, 1);
            let input = datafusion::arrow::compute::concat(&[&some, &null]).unwrap();
            let a = apply(CatalogMask::MaskToDefault, Some(&input), &dt, 2).unwrap();
            assert!(a.is_valid(0) && a.is_null(1), "{dt}");
            datafusion::arrow::util::display::array_value_to_string(&a, 0).unwrap()
        };
        assert_eq!(v(DataType::Int32), "999999999");
        assert_eq!(v(DataType::Int64), "999999999");
        assert_eq!(v(DataType::Utf8), "XXXXXXXX");
        assert_eq!(v(DataType::Boolean), "false");
        assert_eq!(v(DataType::Decimal128(12, 2)), "0.00");
        assert_eq!(v(DataType::Date32), "9999-12-31");
        assert_eq!(
            v(DataType::Timestamp(
                TimeUnit::Microsecond,
                Some("UTC".into())
            )),
            "9999-12-31T00:00:00Z"
        );
        assert_eq!(
            v(DataType::Timestamp(TimeUnit::Nanosecond, None)),
            "2261-12-31T00:00:00"
        );
        assert!(check(CatalogMask::MaskToDefault, "m", &DataType::Int8).is_err());
        assert!(check(CatalogMask::MaskAlphanum, "n", &DataType::Int64).is_err());
        assert!(check(CatalogMask::Sha256Global, "d", &DataType::Date32).is_err());
    }
}
