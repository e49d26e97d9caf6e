//! Just enough of Thrift's compact protocol to read and patch PME structures in place.
//!
//! The plaintext view keeps every byte range of the file where it was, so rewritten
//! structures must keep their length: integers are rewritten in place with the same
//! number of varint bytes (an over-long varint, which every compact-protocol reader
//! accepts: parquet-rs's `read_vlq`, Thrift's own), never re-encoded.
//! Whole structures (footer, column metadata) are read and written with parquet's
//! generated Thrift types.
#![allow(
    deprecated,
    reason = "parquet::format holds parquet 58's only public Thrift types (removed in 59)"
)]

use std::ops::Range;

use parquet::thrift::TSerializable;
use thrift::protocol::{TCompactInputProtocol, TCompactOutputProtocol};

const T_TRUE: u8 = 1;
const T_FALSE: u8 = 2;
const T_BYTE: u8 = 3;
const T_I16: u8 = 4;
const T_I32: u8 = 5;
const T_I64: u8 = 6;
const T_DOUBLE: u8 = 7;
const T_BINARY: u8 = 8;
const T_LIST: u8 = 9;
const T_SET: u8 = 10;
const T_MAP: u8 = 11;
const T_STRUCT: u8 = 12;

/// Parquet's `PageType::DICTIONARY_PAGE`.
pub const DICTIONARY_PAGE: i64 = 2;

/// Reads a Thrift struct off the front of `bytes`, advancing it.
pub fn read<T: TSerializable>(bytes: &mut &[u8]) -> Result<T, String> {
    // A list, map or string cannot hold more elements than there are bytes: a larger
    // count is malformed, and would otherwise be allocated up front (fuzz/thrift_footer
    // found an 8-byte input asking for 47 GB).
    let config = thrift::TConfiguration::builder()
        .max_container_size(Some(bytes.len()))
        .max_string_size(Some(bytes.len()))
        .build()
        .map_err(|e| e.to_string())?;
    let mut p = TCompactInputProtocol::with_config(bytes, config);
    T::read_from_in_protocol(&mut p).map_err(|e| e.to_string())
}

/// Writes a Thrift struct.
pub fn write<T: TSerializable>(value: &T) -> Vec<u8> {
    let mut out = Vec::new();
    let mut p = TCompactOutputProtocol::new(&mut out);
    value
        .write_to_out_protocol(&mut p)
        .expect("writing to a Vec cannot fail");
    out
}

struct Scanner<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Scanner<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    fn byte(&mut self) -> Option<u8> {
        let b = *self.buf.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    /// An unsigned varint and its byte range.
    fn varint(&mut self) -> Option<(u64, Range<usize>)> {
        let start = self.pos;
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f).checked_shl(shift).unwrap_or(0);
            if b & 0x80 == 0 {
                return Some((v, start..self.pos));
            }
        }
        None
    }

    fn zigzag(&mut self) -> Option<(i64, Range<usize>)> {
        let (v, r) = self.varint()?;
        Some((((v >> 1) as i64) ^ -((v & 1) as i64), r))
    }

    /// The next field's id and type; `None` at the struct's stop byte.
    fn field(&mut self, last_id: &mut i16) -> Option<Option<(i16, u8)>> {
        let b = self.byte()?;
        if b == 0 {
            return Some(None);
        }
        let (delta, ty) = (b >> 4, b & 0x0f);
        let id = if delta == 0 {
            i16::try_from(self.zigzag()?.0).ok()?
        } else {
            last_id.checked_add(i16::from(delta))?
        };
        *last_id = id;
        Some(Some((id, ty)))
    }

    fn skip(&mut self, ty: u8, depth: usize) -> Option<()> {
        if depth > 32 {
            return None;
        }
        match ty {
            T_TRUE | T_FALSE => {}
            T_BYTE => {
                self.byte()?;
            }
            T_I16 | T_I32 | T_I64 => {
                self.varint()?;
            }
            T_DOUBLE => self.advance(8)?,
            T_BINARY => {
                let n = usize::try_from(self.varint()?.0).ok()?;
                self.advance(n)?;
            }
            T_LIST | T_SET => {
                let (n, elem) = self.list_header()?;
                // Every element takes a byte at least: a longer count is malformed (and
                // would loop for as long as it says).
                self.at_most_remaining(n)?;
                for _ in 0..n {
                    self.skip_element(elem, depth + 1)?;
                }
            }
            T_MAP => {
                let n = self.varint()?.0;
                if n > 0 {
                    let kv = self.byte()?;
                    self.at_most_remaining(n)?;
                    for _ in 0..n {
                        self.skip_element(kv >> 4, depth + 1)?;
                        self.skip_element(kv & 0x0f, depth + 1)?;
                    }
                }
            }
            T_STRUCT => {
                let mut last = 0;
                while let Some((_, t)) = self.field(&mut last)? {
                    self.skip(t, depth + 1)?;
                }
            }
            _ => return None,
        }
        Some(())
    }

    /// Skips one element of a list, set or map: booleans there take a byte each.
    fn skip_element(&mut self, ty: u8, depth: usize) -> Option<()> {
        if matches!(ty, T_TRUE | T_FALSE) {
            self.byte().map(|_| ())
        } else {
            self.skip(ty, depth)
        }
    }

    /// `None` if `n` elements (a byte each at least) cannot fit in what is left.
    fn at_most_remaining(&self, n: u64) -> Option<()> {
        (n <= (self.buf.len() - self.pos) as u64).then_some(())
    }

    fn list_header(&mut self) -> Option<(u64, u8)> {
        let b = self.byte()?;
        let n = match b >> 4 {
            15 => self.varint()?.0,
            n => u64::from(n),
        };
        Some((n, b & 0x0f))
    }

    fn advance(&mut self, n: usize) -> Option<()> {
        let end = self.pos.checked_add(n)?;
        (end <= self.buf.len()).then(|| self.pos = end)
    }
}

fn zigzag_encode(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// Writes `value` (zig-zag) into `buf[range]` as a varint of exactly that many bytes.
fn patch_varint(buf: &mut [u8], range: Range<usize>, value: i64) -> Option<()> {
    let mut v = zigzag_encode(value);
    let width = range.len();
    let slot = buf.get_mut(range)?;
    for (i, b) in slot.iter_mut().enumerate() {
        if i + 1 == width {
            if v >= 0x80 {
                return None;
            }
            *b = v as u8;
        } else {
            *b = (v & 0x7f) as u8 | 0x80;
            v >>= 7;
        }
    }
    Some(())
}

/// Turns a decrypted page header into its plaintext-view form, in place and keeping its
/// length: `compressed_page_size` becomes `body_len`, and bytes after the struct (if
/// any) are absorbed into it. Returns the page type.
pub fn rewrite_page_header(header: &mut [u8], body_len: i64) -> Option<i64> {
    let mut s = Scanner::new(header);
    let mut last = 0;
    let (mut page_type, mut size_range) = (None, None);
    while let Some((id, ty)) = s.field(&mut last)? {
        match (id, ty) {
            (1, T_I32) => page_type = Some(s.zigzag()?.0),
            (3, T_I32) => size_range = Some(s.zigzag()?.1),
            _ => s.skip(ty, 0)?,
        }
    }
    let end = s.pos;
    patch_varint(header, size_range?, body_len)?;
    absorb_trailing(header, end, last)?;
    page_type
}

/// Makes a decrypted Bloom filter header exactly its module's plaintext length (readers
/// take the bitset to start right after the header struct).
pub fn rewrite_bloom_header(header: &mut [u8]) -> Option<()> {
    let mut s = Scanner::new(header);
    let mut last = 0;
    while let Some((_, ty)) = s.field(&mut last)? {
        s.skip(ty, 0)?;
    }
    let end = s.pos;
    absorb_trailing(header, end, last)
}

/// Bytes after a struct (ending at `end`, with its stop byte; `last_id` its last field)
/// become part of it: unknown fields readers skip. One to three bytes become boolean
/// fields (one byte each); more, one binary field.
fn absorb_trailing(buf: &mut [u8], end: usize, last_id: i16) -> Option<()> {
    let trailing = buf.len() - end;
    if trailing == 0 {
        return Some(());
    }
    let stop = end - 1;
    if trailing < 4 {
        // Boolean fields last+15, last+16...: past every field of the structs padded
        // here (page headers end at 8, Bloom filter headers at 4).
        last_id.checked_add(15 + trailing as i16)?;
        buf[stop] = 0xf0 | T_TRUE;
        buf[stop + 1..stop + trailing].fill(0x10 | T_TRUE);
        buf[stop + trailing] = 0;
        return Some(());
    }
    // Field 100 (long form: type byte, zig-zag id), binary filling the rest, then stop.
    let room = buf.len() - stop;
    let width = (1..=5).find(|w| {
        room.checked_sub(4 + w)
            .is_some_and(|n| varint_len(n as u64) <= *w)
    })?;
    let n = room - 4 - width;
    buf[stop..stop + 3].copy_from_slice(&[T_BINARY, 0xc8, 0x01]);
    let mut v = n as u64;
    for (i, b) in buf[stop + 3..stop + 3 + width].iter_mut().enumerate() {
        *b = (v & 0x7f) as u8 | if i + 1 < width { 0x80 } else { 0 };
        v >>= 7;
    }
    buf[stop + 3 + width..].fill(0);
    Some(())
}

/// One `PageLocation` of an offset index, with where its integers are.
#[derive(Debug, Clone)]
pub struct Location {
    /// Page offset in the file.
    pub offset: i64,
    /// Page size, header included.
    pub size: i64,
    offset_range: Range<usize>,
    size_range: Range<usize>,
}

/// Reads the page locations of an `OffsetIndex`.
pub fn offset_index_locations(index: &[u8]) -> Option<Vec<Location>> {
    let mut s = Scanner::new(index);
    let mut last = 0;
    while let Some((id, ty)) = s.field(&mut last)? {
        if (id, ty) != (1, T_LIST) {
            s.skip(ty, 0)?;
            continue;
        }
        let (n, elem) = s.list_header()?;
        if elem != T_STRUCT {
            return None;
        }
        s.at_most_remaining(n)?;
        let mut out = Vec::with_capacity(usize::try_from(n).ok()?.min(1 << 16));
        for _ in 0..n {
            let mut last = 0;
            let (mut offset, mut size) = (None, None);
            while let Some((id, ty)) = s.field(&mut last)? {
                match (id, ty) {
                    (1, T_I64) => offset = Some(s.zigzag()?),
                    (2, T_I32) => size = Some(s.zigzag()?),
                    _ => s.skip(ty, 0)?,
                }
            }
            let ((offset, offset_range), (size, size_range)) = (offset?, size?);
            out.push(Location {
                offset,
                size,
                offset_range,
                size_range,
            });
        }
        return Some(out);
    }
    None
}

/// Rewrites page locations in place to `(offset, size)` (same length).
pub fn patch_offset_index(
    index: &mut [u8],
    locations: &[Location],
    new: impl IntoIterator<Item = (i64, i64)>,
) -> Option<()> {
    for (loc, (offset, size)) in locations.iter().zip(new) {
        patch_varint(index, loc.offset_range.clone(), offset)?;
        patch_varint(index, loc.size_range.clone(), size)?;
    }
    Some(())
}

/// An `OffsetIndex` with one page covering `[offset, offset + size)` from row 0.
pub fn single_page_offset_index(offset: i64, size: i64) -> Vec<u8> {
    let index = parquet::format::OffsetIndex {
        page_locations: vec![parquet::format::PageLocation {
            offset,
            compressed_page_size: size as i32,
            first_row_index: 0,
        }],
        unencoded_byte_array_data_bytes: None,
    };
    write(&index)
}

fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

/// A header of an `INDEX_PAGE` with an empty body that is exactly `len` bytes long (the
/// bytes after the sizes are an unknown field, which readers skip); readers skip the
/// page. `None` when `len` is under 9 bytes.
///
/// The padding is in the header, not in a page body: parquet-rs's `peek_next_page`
/// skips an index page's header but not its body.
pub fn index_page(len: usize) -> Option<Vec<u8>> {
    // type = INDEX_PAGE, uncompressed_page_size = 0, compressed_page_size = 0.
    const SIZES: [u8; 6] = [0x15, 0x02, 0x15, 0x00, 0x15, 0x00];
    // Field 15 (delta 12 from field 3), binary; PageHeader has no field 15.
    const PAD_FIELD: u8 = 0xc8;
    for width in 1..=5 {
        let Some(body) = len.checked_sub(SIZES.len() + 1 + width + 1) else {
            continue;
        };
        if varint_len(body as u64) > width {
            continue;
        }
        let mut out = Vec::with_capacity(len);
        out.extend_from_slice(&SIZES);
        out.push(PAD_FIELD);
        let at = out.len();
        out.resize(at + width, 0);
        // Binary lengths are plain varints (not zig-zag).
        let mut v = body as u64;
        for (i, b) in out[at..].iter_mut().enumerate() {
            *b = (v & 0x7f) as u8 | if i + 1 < width { 0x80 } else { 0 };
            v >>= 7;
        }
        out.resize(at + width + body, 0);
        out.push(0x00);
        debug_assert_eq!(out.len(), len);
        return Some(out);
    }
    None
}

#[cfg(test)]
mod tests {
    /// Found by fuzz/thrift_footer: a map of booleans with a huge count consumed no byte
    /// per entry and looped for as long as the count said.
    #[test]
    fn huge_collection_counts_fail_at_once() {
        let t = std::time::Instant::now();
        assert!(offset_index_locations(&[203, 203, 203, 203, 203, 137, 63, 33]).is_none());
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        // A list count far beyond the input is refused, not allocated.
        let huge_list = [0x19, 0xfc, 0xff, 0xff, 0xff, 0x07, 0x00];
        assert!(read::<parquet::format::FileMetaData>(&mut &huge_list[..]).is_err());
    }

    use super::*;
    use parquet::format::{DataPageHeader, Encoding, PageHeader, PageLocation, PageType};

    fn header(compressed: i32) -> Vec<u8> {
        write(&PageHeader {
            type_: PageType::DATA_PAGE,
            uncompressed_page_size: 1000,
            compressed_page_size: compressed,
            crc: Some(7),
            data_page_header: Some(DataPageHeader::new(
                10,
                Encoding::PLAIN,
                Encoding::RLE,
                Encoding::RLE,
                None,
            )),
            index_page_header: None,
            dictionary_page_header: None,
            data_page_header_v2: None,
        })
    }

    #[test]
    fn page_size_is_patched_in_place_absorbing_trailing_bytes() {
        for trailing in 0..90 {
            let mut h = header(100_000);
            let len = h.len();
            h.resize(len + trailing, 0xee);
            assert_eq!(rewrite_page_header(&mut h, 5), Some(0));
            assert_eq!(h.len(), len + trailing);
            let mut rest = &h[..];
            let back: PageHeader = read(&mut rest).unwrap();
            assert!(rest.is_empty(), "{trailing}: {} left", rest.len());
            assert_eq!(back.compressed_page_size, 5);
            assert_eq!(back.uncompressed_page_size, 1000);
            assert_eq!(back.crc, Some(7));
            assert_eq!(back.data_page_header.unwrap().num_values, 10);
        }
    }

    #[test]
    fn offset_index_is_patched_in_place() {
        let index = parquet::format::OffsetIndex {
            page_locations: (0..20)
                .map(|i| PageLocation {
                    offset: 1_000_000 + i * 5000,
                    compressed_page_size: 5000,
                    first_row_index: i * 100,
                })
                .collect(),
            unencoded_byte_array_data_bytes: Some(vec![1, 2]),
        };
        let mut bytes = write(&index);
        let locs = offset_index_locations(&bytes).unwrap();
        assert_eq!(locs.len(), 20);
        assert_eq!((locs[3].offset, locs[3].size), (1_015_000, 5000));
        patch_offset_index(&mut bytes, &locs, (0..20).map(|i| (10 + i * 3, 3))).unwrap();
        let back: parquet::format::OffsetIndex = read(&mut &bytes[..]).unwrap();
        assert_eq!(back.page_locations[19].offset, 67);
        assert_eq!(back.page_locations[19].compressed_page_size, 3);
        assert_eq!(back.page_locations[19].first_row_index, 1900);
        assert_eq!(back.unencoded_byte_array_data_bytes, Some(vec![1, 2]));
    }

    #[test]
    fn bloom_headers_absorb_trailing_bytes() {
        use parquet::format::{
            BloomFilterAlgorithm, BloomFilterCompression, BloomFilterHash, BloomFilterHeader,
            SplitBlockAlgorithm, Uncompressed, XxHash,
        };
        let h = BloomFilterHeader {
            num_bytes: 2048,
            algorithm: BloomFilterAlgorithm::BLOCK(SplitBlockAlgorithm {}),
            hash: BloomFilterHash::XXHASH(XxHash {}),
            compression: BloomFilterCompression::UNCOMPRESSED(Uncompressed {}),
        };
        for trailing in 0..90 {
            let mut b = write(&h);
            let len = b.len();
            b.resize(len + trailing, 0x33);
            rewrite_bloom_header(&mut b).unwrap();
            let mut rest = &b[..];
            let back: BloomFilterHeader = read(&mut rest).unwrap();
            assert!(rest.is_empty(), "{trailing}");
            assert_eq!(back, h);
        }
    }

    #[test]
    fn index_pages_have_the_exact_length() {
        assert!(index_page(8).is_none());
        for len in [9, 10, 72, 73, 200, 70_000, 3_000_000] {
            let page = index_page(len).unwrap();
            assert_eq!(page.len(), len);
            let mut rest = &page[..];
            let h: PageHeader = read(&mut rest).unwrap();
            assert_eq!(h.type_, PageType::INDEX_PAGE);
            assert_eq!(h.compressed_page_size, 0);
            assert!(rest.is_empty(), "{len}");
        }
    }
}
