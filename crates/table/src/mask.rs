//! Mask kernels: each turns a column (or nothing, for constant masks) into what a
//! principal may see, batch by batch.

use std::sync::Arc;

use chrono::{Datelike, NaiveDate};
use clearice_policy::Mask;
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Date32Array, ListArray, PrimitiveArray, StringArray, StringViewArray,
    new_empty_array, new_null_array,
};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{ArrowTimestampType, DataType, Date32Type, TimeUnit};
use datafusion::error::{DataFusionError, Result};
use datafusion::scalar::ScalarValue;
use sha2::{Digest, Sha256};

/// Output type of a mask over a column of type `input`.
pub fn output_type(mask: &Mask, input: &DataType) -> DataType {
    match mask {
        Mask::Sha256 => DataType::Utf8,
        _ => input.clone(),
    }
}

/// Checks at plan time that `mask` applies to `dt` (and that a fixed value parses).
pub fn check(mask: &Mask, column: &str, dt: &DataType) -> Result<()> {
    let bad = |what: &str| {
        Err(DataFusionError::Plan(format!(
            "policy mask '{}' cannot apply to column '{column}' of type {dt}: {what}",
            mask.name()
        )))
    };
    match mask {
        Mask::ShowLast4 | Mask::ShowFirst4
            if !matches!(
                dt,
                DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8
            ) =>
        {
            bad("not a string")
        }
        Mask::TruncateToYear | Mask::TruncateToMonth
            if !matches!(dt, DataType::Date32 | DataType::Timestamp(..)) =>
        {
            bad("not a date or timestamp")
        }
        Mask::Fixed(Some(v)) => match ScalarValue::try_from_string(v.clone(), dt) {
            Ok(_) => Ok(()),
            Err(_) => bad(&format!("fixed value {v:?} is not of that type")),
        },
        _ => Ok(()),
    }
}

fn fixed_default(dt: &DataType, len: usize) -> Result<ArrayRef> {
    Ok(match dt {
        DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8 => {
            ScalarValue::Utf8(Some("****".into()))
                .to_array_of_size(len)
                .and_then(|a| Ok(cast(&a, dt)?))?
        }
        DataType::List(field) => Arc::new(ListArray::try_new(
            Arc::clone(field),
            OffsetBuffer::new_zeroed(len),
            new_empty_array(field.data_type()),
            None,
        )?),
        DataType::Boolean => ScalarValue::Boolean(Some(false)).to_array_of_size(len)?,
        dt => match ScalarValue::new_zero(dt) {
            Ok(z) => z.to_array_of_size(len)?,
            Err(_) => new_null_array(dt, len),
        },
    })
}

/// Applies `mask`; `input` is the decrypted column, absent for constant masks.
pub fn apply(mask: &Mask, input: Option<&ArrayRef>, dt: &DataType, len: usize) -> Result<ArrayRef> {
    let input = || {
        input.ok_or_else(|| {
            DataFusionError::Internal(format!("mask {} needs its column", mask.name()))
        })
    };
    match mask {
        Mask::Null => Ok(new_null_array(dt, len)),
        Mask::Fixed(None) => fixed_default(dt, len),
        Mask::Fixed(Some(v)) => ScalarValue::try_from_string(v.clone(), dt)?.to_array_of_size(len),
        Mask::ShowLast4 => keep_chars(input()?, false),
        Mask::ShowFirst4 => keep_chars(input()?, true),
        Mask::Sha256 => sha256(input()?),
        Mask::TruncateToYear => truncate(input()?, false),
        Mask::TruncateToMonth => truncate(input()?, true),
    }
}

fn mask_str(s: &str, keep_first: bool) -> String {
    let n = s.chars().count();
    s.chars()
        .enumerate()
        .map(|(i, c)| {
            let kept = if keep_first { i < 4 } else { i + 4 >= n };
            if kept || !c.is_alphanumeric() { c } else { 'X' }
        })
        .collect()
}

fn keep_chars(a: &ArrayRef, keep_first: bool) -> Result<ArrayRef> {
    let out: ArrayRef = match a.data_type() {
        DataType::Utf8View => Arc::new(
            a.as_string_view()
                .iter()
                .map(|v| v.map(|s| mask_str(s, keep_first)))
                .collect::<StringViewArray>(),
        ),
        DataType::Utf8 => Arc::new(
            a.as_string::<i32>()
                .iter()
                .map(|v| v.map(|s| mask_str(s, keep_first)))
                .collect::<StringArray>(),
        ),
        _ => {
            let s = cast(a, &DataType::Utf8)?;
            let masked: ArrayRef = Arc::new(
                s.as_string::<i32>()
                    .iter()
                    .map(|v| v.map(|s| mask_str(s, keep_first)))
                    .collect::<StringArray>(),
            );
            cast(&masked, a.data_type())?
        }
    };
    Ok(out)
}

fn sha256(a: &ArrayRef) -> Result<ArrayRef> {
    let s = cast(a, &DataType::Utf8)?;
    let s = s.as_string::<i32>();
    Ok(Arc::new(
        s.iter()
            .map(|v| v.map(|t| hex::encode(Sha256::digest(t.as_bytes()))))
            .collect::<StringArray>(),
    ))
}

fn trunc_date(d: NaiveDate, month: bool) -> NaiveDate {
    NaiveDate::from_ymd_opt(d.year(), if month { d.month() } else { 1 }, 1)
        .expect("valid first day")
}

fn truncate(a: &ArrayRef, month: bool) -> Result<ArrayRef> {
    let epoch = NaiveDate::from_ymd_opt(1970, 1, 1).expect("epoch");
    match a.data_type() {
        DataType::Date32 => {
            let d = a.as_primitive::<Date32Type>();
            let out: Date32Array = d.unary(|v| {
                let date = epoch + chrono::Duration::days(v as i64);
                (trunc_date(date, month) - epoch).num_days() as i32
            });
            Ok(Arc::new(out))
        }
        DataType::Timestamp(unit, _) => {
            use datafusion::arrow::datatypes::{
                TimestampMicrosecondType as Us, TimestampMillisecondType as Ms,
                TimestampNanosecondType as Ns, TimestampSecondType as S,
            };
            fn go<T: ArrowTimestampType>(a: &ArrayRef, per_day: i64, month: bool) -> ArrayRef {
                let epoch = NaiveDate::from_ymd_opt(1970, 1, 1).expect("epoch");
                let p: &PrimitiveArray<T> = a.as_primitive::<T>();
                let out: PrimitiveArray<T> = p.unary(|v| {
                    let days = v.div_euclid(per_day);
                    let date = epoch + chrono::Duration::days(days);
                    (trunc_date(date, month) - epoch).num_days() * per_day
                });
                Arc::new(out.with_data_type(a.data_type().clone()))
            }
            Ok(match unit {
                TimeUnit::Second => go::<S>(a, 86_400, month),
                TimeUnit::Millisecond => go::<Ms>(a, 86_400_000, month),
                TimeUnit::Microsecond => go::<Us>(a, 86_400_000_000, month),
                TimeUnit::Nanosecond => go::<Ns>(a, 86_400_000_000_000, month),
            })
        }
        other => Err(DataFusionError::Plan(format!("truncate mask on {other}"))),
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests may block")]
mod tests {
    use super::*;

    #[test]
    fn show_last_4_keeps_separators_and_last_four() {
        assert_eq!(mask_str("123-45-6789", false), "XXX-XX-6789");
        assert_eq!(mask_str("ab", false), "ab");
        assert_eq!(mask_str("José Garcia", true), "José XXXXXX");
    }

    #[test]
    fn truncate_dates_and_timestamps() {
        let d: ArrayRef = Arc::new(Date32Array::from(vec![Some(19_000), None, Some(-1)]));
        let y = truncate(&d, false).unwrap();
        let y = y.as_primitive::<Date32Type>();
        assert_eq!(
            y.value(0),
            (NaiveDate::from_ymd_opt(2022, 1, 1).unwrap()
                - NaiveDate::from_ymd_opt(1970, 1, 1).unwrap())
            .num_days() as i32
        );
        assert!(y.is_null(1));
        assert_eq!(
            y.value(2),
            (NaiveDate::from_ymd_opt(1969, 1, 1).unwrap()
                - NaiveDate::from_ymd_opt(1970, 1, 1).unwrap())
            .num_days() as i32
        );
    }

    #[test]
    fn constant_masks_need_no_input() {
        let a = apply(&Mask::Null, None, &DataType::Utf8View, 3).unwrap();
        assert_eq!(a.null_count(), 3);
        let f = apply(&Mask::Fixed(None), None, &DataType::Utf8View, 2).unwrap();
        assert_eq!(f.as_string_view().value(1), "****");
        let f = apply(
            &Mask::Fixed(Some("7.50".into())),
            None,
            &DataType::Decimal128(12, 2),
            1,
        )
        .unwrap();
        assert_eq!(
            ScalarValue::try_from_array(&f, 0).unwrap(),
            ScalarValue::Decimal128(Some(750), 12, 2)
        );
    }

    #[test]
    fn sha256_is_hex_of_the_text() {
        let a: ArrayRef = Arc::new(StringViewArray::from(vec![Some("abc"), None]));
        let h = sha256(&a).unwrap();
        assert_eq!(
            h.as_string::<i32>().value(0),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(h.is_null(1));
    }
}
