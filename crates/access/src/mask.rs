//! Mask kernels: each turns a column (or nothing, for constant masks) into what a
//! principal may see, batch by batch.

use std::sync::Arc;

use clearice_crypto::MaskKey;
use clearice_policy::Mask;
use datafusion::arrow::array::builder::NullBufferBuilder;
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Date32Array, ListArray, PrimitiveArray, StringArray, StringBuilder,
    StringViewArray, StringViewBuilder, new_empty_array, new_null_array,
};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{ArrowTimestampType, DataType, Date32Type, TimeUnit};
use datafusion::error::{DataFusionError, Result};
use datafusion::scalar::ScalarValue;
use sha2::{Digest, Sha256};

mod catalog;

/// Output type of a mask over a column of type `input`.
pub fn output_type(mask: &Mask, input: &DataType) -> DataType {
    match mask {
        Mask::Sha256 | Mask::HmacSha256 => DataType::Utf8,
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
        Mask::Catalog(c) => catalog::check(*c, column, dt),
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

/// Applies `mask`; `input` is the decrypted column, absent for constant masks; `key`:
/// the `hmac_sha256` mask's secret, where the policy has one.
pub fn apply(
    mask: &Mask,
    input: Option<&ArrayRef>,
    dt: &DataType,
    len: usize,
    key: Option<&MaskKey>,
) -> Result<ArrayRef> {
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
        Mask::Sha256 => hash(input()?, &Hash::Plain),
        Mask::HmacSha256 => {
            let key = key.ok_or_else(|| {
                DataFusionError::Execution(
                    "mask 'hmac_sha256': the policy's secret is not loaded in this process ([masks] hmac_key_file)".into(),
                )
            })?;
            hash(input()?, &Hash::keyed(key))
        }
        Mask::TruncateToYear => truncate(input()?, false),
        Mask::TruncateToMonth => truncate(input()?, true),
        Mask::Catalog(c) => catalog::apply(*c, input().ok(), dt, len),
    }
}

/// Appends `s` with every alphanumeric character but the first or last four replaced by
/// `X` (separators kept).
fn mask_into(s: &str, keep_first: bool, out: &mut String) {
    if s.is_ascii() {
        let n = s.len();
        let range = if keep_first {
            n.min(4)..n
        } else {
            0..n.saturating_sub(4)
        };
        let (before, masked, after) = (&s[..range.start], &s[range.clone()], &s[range.end..]);
        out.push_str(before);
        out.extend(masked.bytes().map(|b| {
            if b.is_ascii_alphanumeric() {
                'X'
            } else {
                b as char
            }
        }));
        out.push_str(after);
        return;
    }
    let n = s.chars().count();
    out.extend(s.chars().enumerate().map(|(i, c)| {
        let kept = if keep_first { i < 4 } else { i + 4 >= n };
        if kept || !c.is_alphanumeric() { c } else { 'X' }
    }));
}

/// ASCII values: the masked text has the same length, so the offsets and nulls of the
/// input are reused and only the value bytes are rewritten, in one pass over the buffer.
fn keep_chars_ascii(a: &StringArray, keep_first: bool) -> StringArray {
    let offsets = a.offsets();
    let values = a.value_data();
    let base = offsets[0] as usize;
    let mut out = values[base..offsets[offsets.len() - 1] as usize].to_vec();
    for w in offsets.windows(2) {
        let (start, end) = (w[0] as usize - base, w[1] as usize - base);
        let len = end - start;
        let range = if keep_first {
            start + len.min(4)..end
        } else {
            start..start + len.saturating_sub(4)
        };
        for b in &mut out[range] {
            if b.is_ascii_alphanumeric() {
                *b = b'X';
            }
        }
    }
    let shifted: Vec<i32> = offsets.iter().map(|o| o - offsets[0]).collect();
    StringArray::new(
        OffsetBuffer::new(shifted.into()),
        out.into(),
        a.nulls().cloned(),
    )
}

/// Each value of `a` rewritten by `f` (which appends to a cleared, reused buffer); NULL
/// stays NULL.
fn map_strings(a: &StringArray, mut f: impl FnMut(&str, &mut String)) -> StringArray {
    let mut b = StringBuilder::with_capacity(a.len(), a.value_data().len());
    let mut scratch = String::new();
    for v in a.iter() {
        match v {
            Some(v) => {
                scratch.clear();
                f(v, &mut scratch);
                b.append_value(&scratch);
            }
            None => b.append_null(),
        }
    }
    b.finish()
}

/// Other text: value by value through one reused buffer.
fn keep_chars_rows(a: &StringArray, keep_first: bool) -> StringArray {
    map_strings(a, |v, out| mask_into(v, keep_first, out))
}

/// `StringView` values masked into new views: values of up to 12 bytes stay inline,
/// longer ones are copied once into the builder's blocks (no cast to `Utf8` and back).
fn keep_chars_view(a: &StringViewArray, keep_first: bool) -> StringViewArray {
    let mut b = StringViewBuilder::with_capacity(a.len());
    let mut scratch = String::new();
    for v in a.iter() {
        match v {
            Some(v) => {
                scratch.clear();
                mask_into(v, keep_first, &mut scratch);
                b.append_value(&scratch);
            }
            None => b.append_null(),
        }
    }
    b.finish()
}

fn keep_chars(a: &ArrayRef, keep_first: bool) -> Result<ArrayRef> {
    match a.data_type() {
        DataType::Utf8 => {
            let s = a.as_string::<i32>();
            let o = s.offsets();
            let used = &s.value_data()[o[0] as usize..o[o.len() - 1] as usize];
            Ok(Arc::new(if used.is_ascii() {
                keep_chars_ascii(s, keep_first)
            } else {
                keep_chars_rows(s, keep_first)
            }))
        }
        // Views (what DataFusion's Parquet scans produce): straight into new views.
        DataType::Utf8View => Ok(Arc::new(keep_chars_view(a.as_string_view(), keep_first))),
        // Other types: through Utf8 and back (the casts copy bytes once each way).
        _ => {
            let s = cast(a, &DataType::Utf8)?;
            Ok(cast(&keep_chars(&s, keep_first)?, a.data_type())?)
        }
    }
}

/// SHA-256 initial state (FIPS 180-4 §5.3.3).
const SHA256_IV: [u32; 8] = [
    0x6a09_e667,
    0xbb67_ae85,
    0x3c6e_f372,
    0xa54f_f53a,
    0x510e_527f,
    0x9b05_688c,
    0x1f83_d9ab,
    0x5be0_cd19,
];

fn compress(state: &mut [u32; 8], block: &[u8]) {
    sha2::compress256(
        state,
        std::slice::from_ref(sha2::digest::generic_array::GenericArray::from_slice(block)),
    );
}

/// SHA-256 of `prefix_len` bytes already compressed into `state`, then `v`: whole blocks
/// of `v` compressed directly, the tail padded into one or two blocks. Values under 56
/// bytes (ids, e-mails, card numbers: nearly all masked values) take one compression and
/// no hasher's buffering.
fn sha256_from(mut state: [u32; 8], prefix_len: u64, v: &[u8]) -> [u32; 8] {
    let whole = v.len() / 64 * 64;
    for block in v[..whole].chunks_exact(64) {
        compress(&mut state, block);
    }
    let rest = &v[whole..];
    let mut tail = [0u8; 128];
    tail[..rest.len()].copy_from_slice(rest);
    tail[rest.len()] = 0x80;
    let n = if rest.len() < 56 { 64 } else { 128 };
    tail[n - 8..n].copy_from_slice(&((prefix_len + v.len() as u64) * 8).to_be_bytes());
    for block in tail[..n].chunks_exact(64) {
        compress(&mut state, block);
    }
    state
}

/// What a hash mask computes: SHA-256, or HMAC-SHA256 (RFC 2104) under the policy's key,
/// whose two padded key blocks are compressed once per batch, not per value.
enum Hash {
    Plain,
    /// The states after `K ^ ipad` and `K ^ opad` (zeroed when dropped: each is as good
    /// as the key for computing the mask).
    Keyed(zeroize::Zeroizing<[[u32; 8]; 2]>),
}

impl Hash {
    fn keyed(key: &MaskKey) -> Self {
        let k = key.expose();
        let mut block = zeroize::Zeroizing::new([0u8; 64]);
        if k.len() > 64 {
            block[..32].copy_from_slice(&Sha256::digest(k));
        } else {
            block[..k.len()].copy_from_slice(k);
        }
        let mut states = zeroize::Zeroizing::new([SHA256_IV; 2]);
        for (state, pad) in states.iter_mut().zip([0x36u8, 0x5c]) {
            let mut padded = zeroize::Zeroizing::new(*block);
            padded.iter_mut().for_each(|b| *b ^= pad);
            compress(state, &*padded);
        }
        Hash::Keyed(states)
    }

    fn digest(&self, v: &[u8]) -> [u32; 8] {
        match self {
            Hash::Plain => sha256_from(SHA256_IV, 0, v),
            Hash::Keyed(states) => {
                let inner = sha256_from(states[0], 64, v);
                let mut bytes = [0u8; 32];
                for (o, w) in bytes.chunks_exact_mut(4).zip(inner) {
                    o.copy_from_slice(&w.to_be_bytes());
                }
                sha256_from(states[1], 64, &bytes)
            }
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Hash::Plain => "sha256",
            Hash::Keyed(_) => "hmac_sha256",
        }
    }
}

/// Lower-case hex of a digest into `out`.
fn hex_into(state: [u32; 8], out: &mut [u8; 64]) {
    /// Two hex digits per byte value.
    const HEX: [[u8; 2]; 256] = {
        let digits = b"0123456789abcdef";
        let mut t = [[0u8; 2]; 256];
        let mut i = 0;
        while i < 256 {
            t[i] = [digits[i >> 4], digits[i & 15]];
            i += 1;
        }
        t
    };
    for (o, w) in out.chunks_exact_mut(8).zip(state) {
        let [a, b, c, d] = w.to_be_bytes();
        o[0..2].copy_from_slice(&HEX[usize::from(a)]);
        o[2..4].copy_from_slice(&HEX[usize::from(b)]);
        o[4..6].copy_from_slice(&HEX[usize::from(c)]);
        o[6..8].copy_from_slice(&HEX[usize::from(d)]);
    }
}

/// Lower-case hex SHA-256 of each value's text.
#[cfg(test)]
fn sha256(a: &ArrayRef) -> Result<ArrayRef> {
    hash(a, &Hash::Plain)
}

/// Lower-case hex hash of each value's text, written into one buffer of 64 bytes per
/// non-null value (no per-row allocation); dictionary arrays hash each distinct value once.
fn hash(a: &ArrayRef, how: &Hash) -> Result<ArrayRef> {
    if let DataType::Dictionary(_, _) = a.data_type() {
        let dict = a.as_any_dictionary();
        let hashed = hash(dict.values(), how)?;
        return Ok(cast(&dict.with_values(hashed), &DataType::Utf8)?);
    }
    let hash_all = |len: usize, values: &mut dyn Iterator<Item = Option<&[u8]>>| {
        if len > i32::MAX as usize / 64 {
            return Err(DataFusionError::ResourcesExhausted(format!(
                "{} mask: a batch of {len} rows is too large (at most {} rows)",
                how.name(),
                i32::MAX / 64
            )));
        }
        let mut bytes = Vec::with_capacity(len * 64);
        let mut offsets = Vec::with_capacity(len + 1);
        offsets.push(0i32);
        let mut nulls = NullBufferBuilder::new(len);
        let mut hex = [0u8; 64];
        for v in values {
            match v {
                Some(v) => {
                    hex_into(how.digest(v), &mut hex);
                    bytes.extend_from_slice(&hex);
                    nulls.append_non_null();
                }
                None => nulls.append_null(),
            }
            offsets.push(bytes.len() as i32);
        }
        Ok(StringArray::new(
            OffsetBuffer::new(offsets.into()),
            bytes.into(),
            nulls.finish(),
        ))
    };
    Ok(Arc::new(match a.data_type() {
        DataType::Utf8View => {
            let v = a.as_string_view();
            hash_all(v.len(), &mut v.iter().map(|s| s.map(str::as_bytes)))?
        }
        DataType::Utf8 => {
            let v = a.as_string::<i32>();
            hash_all(v.len(), &mut v.iter().map(|s| s.map(str::as_bytes)))?
        }
        _ => {
            let s = cast(a, &DataType::Utf8)?;
            let v = s.as_string::<i32>();
            hash_all(v.len(), &mut v.iter().map(|s| s.map(str::as_bytes)))?
        }
    }))
}

/// First day of the year (or month) of the day `days` after 1970-01-01, in days after
/// 1970-01-01: integer arithmetic on the proleptic Gregorian calendar (H. Hinnant's
/// `civil_from_days`/`days_from_civil`), so the mask runs at memory speed.
fn trunc_days(days: i64, month: bool) -> i64 {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let m = if month { m } else { 1 };
    // days_from_civil(y, m, 1)
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn truncate(a: &ArrayRef, month: bool) -> Result<ArrayRef> {
    match a.data_type() {
        DataType::Date32 => {
            let d = a.as_primitive::<Date32Type>();
            let out: Date32Array = d.unary(|v| trunc_days(i64::from(v), month) as i32);
            Ok(Arc::new(out))
        }
        DataType::Timestamp(unit, _) => {
            use datafusion::arrow::datatypes::{
                TimestampMicrosecondType as Us, TimestampMillisecondType as Ms,
                TimestampNanosecondType as Ns, TimestampSecondType as S,
            };
            fn go<T: ArrowTimestampType>(a: &ArrayRef, per_day: i64, month: bool) -> ArrayRef {
                let p: &PrimitiveArray<T> = a.as_primitive::<T>();
                let out: PrimitiveArray<T> =
                    p.unary(|v| trunc_days(v.div_euclid(per_day), month) * per_day);
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
    use datafusion::arrow::array::StringViewArray;

    /// The rule, character by character (the kernels must agree with it).
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
    use chrono::{Datelike, NaiveDate};

    #[test]
    fn show_last_4_keeps_separators_and_last_four() {
        assert_eq!(mask_str("123-45-6789", false), "XXX-XX-6789");
        assert_eq!(mask_str("ab", false), "ab");
        assert_eq!(mask_str("José Garcia", true), "José XXXXXX");
    }

    #[test]
    fn show_4_kernels_agree_with_the_per_value_rule() {
        let values = vec![
            Some("123-45-6789"),
            None,
            Some(""),
            Some("ab"),
            Some("4111111111111111"),
            Some("José Garcia"),
            Some("x@y.org"),
        ];
        for keep_first in [false, true] {
            let want: Vec<Option<String>> = values
                .iter()
                .map(|v| v.map(|s| mask_str(s, keep_first)))
                .collect();
            // ASCII-only Utf8 (the in-place kernel), sliced so offsets do not start at 0.
            let ascii: ArrayRef = Arc::new(StringArray::from(values.clone()));
            let ascii = ascii.slice(1, 4);
            let got = keep_chars(&ascii, keep_first).unwrap();
            let got: Vec<Option<String>> = got
                .as_string::<i32>()
                .iter()
                .map(|v| v.map(str::to_owned))
                .collect();
            assert_eq!(got, want[1..5].to_vec());
            // ASCII views, non-ASCII Utf8 and Utf8View.
            let ascii_view: ArrayRef = Arc::new(StringViewArray::from(values[..5].to_vec()));
            let got = cast(
                &keep_chars(&ascii_view, keep_first).unwrap(),
                &DataType::Utf8,
            )
            .unwrap();
            let got: Vec<Option<String>> = got
                .as_string::<i32>()
                .iter()
                .map(|v| v.map(str::to_owned))
                .collect();
            assert_eq!(got, want[..5].to_vec());
            for a in [
                Arc::new(StringArray::from(values.clone())) as ArrayRef,
                Arc::new(StringViewArray::from(values.clone())) as ArrayRef,
            ] {
                let got = cast(&keep_chars(&a, keep_first).unwrap(), &DataType::Utf8).unwrap();
                let got: Vec<Option<String>> = got
                    .as_string::<i32>()
                    .iter()
                    .map(|v| v.map(str::to_owned))
                    .collect();
                assert_eq!(got, want);
                assert_eq!(
                    keep_chars(&a, keep_first).unwrap().data_type(),
                    a.data_type()
                );
            }
        }
    }

    #[test]
    fn day_arithmetic_agrees_with_chrono() {
        let epoch = NaiveDate::from_ymd_opt(1970, 1, 1).unwrap();
        for days in (-1_000_000i64..1_000_000)
            .step_by(13)
            .chain([-1, 0, 59, 60, 365, 11_016])
        {
            let d = epoch + chrono::Duration::days(days);
            for month in [false, true] {
                let want = NaiveDate::from_ymd_opt(d.year(), if month { d.month() } else { 1 }, 1)
                    .unwrap();
                assert_eq!(
                    trunc_days(days, month),
                    (want - epoch).num_days(),
                    "{d} {month}"
                );
            }
        }
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
        let a = apply(&Mask::Null, None, &DataType::Utf8View, 3, None).unwrap();
        assert_eq!(a.null_count(), 3);
        let f = apply(&Mask::Fixed(None), None, &DataType::Utf8View, 2, None).unwrap();
        assert_eq!(f.as_string_view().value(1), "****");
        let f = apply(
            &Mask::Fixed(Some("7.50".into())),
            None,
            &DataType::Decimal128(12, 2),
            1,
            None,
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
        // Around the one-block limit (55/56 bytes) and beyond: as the hasher computes.
        for n in [0, 1, 54, 55, 56, 63, 64, 65, 119, 120, 1000] {
            let text = "é".repeat(n / 2) + &"x".repeat(n % 2);
            let a: ArrayRef = Arc::new(StringArray::from(vec![text.as_str()]));
            assert_eq!(
                sha256(&a).unwrap().as_string::<i32>().value(0),
                hex::encode(Sha256::digest(text.as_bytes())),
                "{n} bytes"
            );
        }
        let d: ArrayRef = Arc::new(
            vec![Some("abc"), None, Some("abc")]
                .into_iter()
                .collect::<datafusion::arrow::array::DictionaryArray<
                    datafusion::arrow::datatypes::Int32Type,
                >>(),
        );
        let h = sha256(&d).unwrap();
        assert_eq!(h.data_type(), &DataType::Utf8);
        assert_eq!(h.as_string::<i32>().value(2), h.as_string::<i32>().value(0));
        assert!(h.is_null(1));
    }

    /// HMAC-SHA256 as RFC 2104 writes it, with the hasher (the kernel must agree).
    fn hmac_reference(key: &[u8], m: &[u8]) -> String {
        let mut k = [0u8; 64];
        if key.len() > 64 {
            k[..32].copy_from_slice(&Sha256::digest(key));
        } else {
            k[..key.len()].copy_from_slice(key);
        }
        let pad = |p: u8| k.iter().map(|b| b ^ p).collect::<Vec<u8>>();
        let inner = Sha256::new()
            .chain_update(pad(0x36))
            .chain_update(m)
            .finalize();
        hex::encode(
            Sha256::new()
                .chain_update(pad(0x5c))
                .chain_update(inner)
                .finalize(),
        )
    }

    #[test]
    fn hmac_sha256_matches_rfc_4231_and_the_reference_at_every_block_boundary() {
        let hmac = |key: &MaskKey, values: Vec<&str>| -> Vec<Option<String>> {
            let a: ArrayRef = Arc::new(StringArray::from(values));
            apply(
                &Mask::HmacSha256,
                Some(&a),
                &DataType::Utf8,
                a.len(),
                Some(key),
            )
            .unwrap()
            .as_string::<i32>()
            .iter()
            .map(|v| v.map(str::to_owned))
            .collect()
        };
        // RFC 4231 test cases 6 and 7: a 131-byte key (hashed first), short and long data.
        let rfc = MaskKey::from_file_bytes("k", vec![0xaa; 131]).unwrap();
        assert_eq!(
            hmac(
                &rfc,
                vec![
                    "Test Using Larger Than Block-Size Key - Hash Key First",
                    "This is a test using a larger than block-size key and a larger than block-size data. The key needs to be hashed before being used by the HMAC algorithm."
                ]
            ),
            vec![
                Some("60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54".into()),
                Some("9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2".into()),
            ]
        );
        for key_len in [32, 64] {
            let bytes: Vec<u8> = (0..key_len as u8).map(|i| b'A' + i % 26).collect();
            let key = MaskKey::from_file_bytes("k", bytes.clone()).unwrap();
            for n in [0, 1, 54, 55, 56, 63, 64, 65, 119, 120, 1000] {
                let text = "é".repeat(n / 2) + &"x".repeat(n % 2);
                assert_eq!(
                    hmac(&key, vec![text.as_str()])[0].as_deref(),
                    Some(hmac_reference(&bytes, text.as_bytes()).as_str()),
                    "{key_len}-byte key, {n} bytes"
                );
            }
        }
        // Keyed: not the unkeyed hash, and another key gives another hash.
        let key = MaskKey::from_file_bytes("k", vec![b'k'; 32]).unwrap();
        let other = MaskKey::from_file_bytes("k", vec![b'o'; 32]).unwrap();
        let a: ArrayRef = Arc::new(StringArray::from(vec!["ann@example.com"]));
        let plain = sha256(&a).unwrap();
        let h = hmac(&key, vec!["ann@example.com"]);
        assert_ne!(h[0].as_deref(), Some(plain.as_string::<i32>().value(0)));
        assert_ne!(h, hmac(&other, vec!["ann@example.com"]));
        // Without its key the mask fails, naming what is missing.
        let e = apply(&Mask::HmacSha256, Some(&a), &DataType::Utf8, 1, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("hmac_key_file"), "{e}");
    }
}
