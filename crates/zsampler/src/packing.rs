//! The rows of a concatenation plan: documents laid end to end in a token stream (each followed
//! by its end-of-document token when there is one) and cut into rows of `seq_len` tokens.
//!
//! `starts[k]` is where the `k`-th document of the stream begins (`starts[n]` is the stream's
//! length) and `order[k]` which document it is. Row `j` holds stream tokens `[j * seq_len,
//! (j + 1) * seq_len)`; its *parts* are the pieces of the documents it overlaps, in stream
//! order. This is the native form of `loaderx/_pack_plan.py`'s `ConcatPlan.parts`, which is the
//! reference the Python tests pin both against.
#![allow(
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss,
    clippy::cast_possible_truncation,
    reason = "token counts and positions stay far below 2^62 (2^24 records of at most 1 MiB), \
              and a position inside one document below 2^31 (the int32 positions a batch holds)"
)]

/// One part of a row: a run of tokens of one document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    /// The document (`order[k]`).
    pub doc: u64,
    /// Position in the document of the part's first token.
    pub doc_pos: u64,
    /// Tokens in the part, the end-of-document token included when the part holds it.
    pub length: u64,
    /// Of `length`, how many tokens are the document's own (the rest, 0 or 1, is its end token).
    pub content: u64,
    /// Where the part's first token goes in the batch (rows back to back).
    pub flat: u64,
    /// 1, 2, ... for the documents of a row, in row order.
    pub segment: i32,
}

/// The parts of `rows` (each below `starts.last() / seq_len`), appended to `out` in row order.
/// `eos`: whether each document's last stream token is its end token. Empty documents hold no
/// token of any row and give no part.
pub fn concat_parts(
    starts: &[i64],
    order: impl Fn(usize) -> u64,
    seq_len: u64,
    eos: bool,
    rows: &[u64],
    out: &mut Vec<Part>,
) {
    let s = seq_len as i64;
    for (r, &row) in rows.iter().enumerate() {
        let lo = row as i64 * s;
        let hi = lo + s;
        // The last document starting at or before `lo`, then every one starting before `hi`.
        let first = starts.partition_point(|&v| v <= lo).saturating_sub(1);
        let mut segment = 0;
        let mut k = first;
        while k + 1 < starts.len() && starts[k] < hi {
            let (begin, end) = (starts[k], starts[k + 1]);
            let part_lo = begin.max(lo);
            let part_hi = end.min(hi);
            if part_hi > part_lo {
                segment += 1;
                let length = (part_hi - part_lo) as u64;
                let ends_here = eos && end <= hi;
                out.push(Part {
                    doc: order(k),
                    doc_pos: (part_lo - begin) as u64,
                    length,
                    content: length - u64::from(ends_here),
                    flat: r as u64 * seq_len + (part_lo - lo) as u64,
                    segment,
                });
            }
            k += 1;
        }
    }
}

/// The parts of `rows` of a first-fit plan, appended to `out` in row order: row `r` holds the
/// documents `row_docs[row_ptr[r]..row_ptr[r + 1]]` whole, one after another from the row's
/// start, each taking `size(doc)` tokens (its end token counted when `eos`); the rest of the
/// row is padding, no part. `doc(k)` is entry `k` of `row_docs` and `size(d)` document `d`'s
/// size; either answers `None` past its table.
///
/// # Errors
/// The first row whose plan entries are missing or do not fit in `seq_len` tokens.
pub fn first_fit_parts(
    row_ptr: &[i64],
    doc: impl Fn(usize) -> Option<u64>,
    size: impl Fn(u64) -> Option<u64>,
    seq_len: u64,
    eos: bool,
    rows: &[u64],
    out: &mut Vec<Part>,
) -> Result<(), u64> {
    for (r, &row) in rows.iter().enumerate() {
        let at = usize::try_from(row).map_err(|_| row)?;
        let (Some(&lo), Some(&hi)) = (row_ptr.get(at), row_ptr.get(at + 1)) else {
            return Err(row);
        };
        let (mut used, mut segment) = (0u64, 0i32);
        for k in lo.max(0)..hi.max(0) {
            let d = doc(k as usize).ok_or(row)?;
            let length = size(d).ok_or(row)?;
            if used + length > seq_len {
                return Err(row);
            }
            segment += 1;
            out.push(Part {
                doc: d,
                doc_pos: 0,
                length,
                content: length - u64::from(eos && length > 0),
                flat: r as u64 * seq_len + used,
                segment,
            });
            used += length;
        }
    }
    Ok(())
}

/// The byte windows a batch of parts reads, as a store's windowed gather takes them: record,
/// first byte in it, bytes, destination byte (tokens of `itemsize` bytes).
#[derive(Debug, Default)]
pub struct Windows {
    /// The store record of each window.
    pub records: Vec<u64>,
    /// The window's first byte in its record.
    pub starts: Vec<u64>,
    /// The window's bytes.
    pub lens: Vec<u64>,
    /// Where the window's first byte goes in the batch.
    pub offsets: Vec<u64>,
}

/// Where the parts' document tokens are stored (see [`record_windows`]): each document's
/// first record (`None`: document `d` is record `d`), the piece size in tokens (0: whole
/// records), and the view's records in the store (`None`: the store's own indices).
#[derive(Clone, Copy)]
pub struct Layout<'a> {
    /// Each document's first record (`None` past the table); `None`: document `d` is record `d`.
    pub first_record: Option<&'a (dyn Fn(u64) -> Option<u64> + Sync)>,
    /// Tokens per piece (0: documents are whole records).
    pub piece_rows: u64,
    /// The store record of each view record; `None`: the view is the store.
    pub view: Option<&'a [u64]>,
}

/// Why a batch's parts cannot be mapped to records: a document the layout does not know, or a
/// record outside the view.
#[derive(Debug, PartialEq, Eq)]
pub enum LayoutError {
    /// A document the layout does not know.
    Document(u64),
    /// A record outside the view.
    Record(u64),
}

/// The [`Windows`] of `parts` under `layout`, in bytes of `itemsize`-byte tokens.
///
/// # Errors
/// The first document or record the layout does not hold.
pub fn windows(parts: &[Part], layout: Layout<'_>, itemsize: u64) -> Result<Windows, LayoutError> {
    let n = parts.len() + parts.len() / 2; // a part spans few pieces
    let mut w = Windows {
        records: Vec::with_capacity(n),
        starts: Vec::with_capacity(n),
        lens: Vec::with_capacity(n),
        offsets: Vec::with_capacity(n),
    };
    let first = |doc: u64| layout.first_record.map_or(Some(doc), |f| f(doc));
    let mut outside = None;
    record_windows(parts, first, layout.piece_rows, |record, start, count, at| {
        let stored = layout.view.map_or(Some(record), |v| v.get(record as usize).copied());
        outside = outside.or(stored.is_none().then_some(record));
        w.records.push(stored.unwrap_or(u64::MAX));
        w.starts.push(start * itemsize);
        w.lens.push(count * itemsize);
        w.offsets.push(at * itemsize);
    })
    .map_err(LayoutError::Document)?;
    match outside {
        Some(record) => Err(LayoutError::Record(record)),
        None => Ok(w),
    }
}

/// Writes the end token `eos` (its low `itemsize` bytes, little-endian) after every part that
/// ends its document, into `dst` (the batch's tokens).
pub fn write_end_tokens(parts: &[Part], eos: u64, itemsize: usize, dst: &mut [u8]) {
    let bytes = eos.to_le_bytes();
    for p in parts.iter().filter(|p| p.length > p.content) {
        let at = (p.flat + p.content) as usize * itemsize;
        if let Some(slot) = dst.get_mut(at..at + itemsize) {
            slot.copy_from_slice(&bytes[..itemsize]);
        }
    }
}

/// Fills `dst` (the batch's tokens) with the token `pad`, and the segment ids and positions with
/// 0: what the parts do not cover is padding.
pub fn fill_padding(pad: u64, itemsize: usize, dst: &mut [u8], seg: &mut [i32], pos: &mut [i32]) {
    /// `dst` as `N`-byte tokens, each set to `pad`'s low bytes: a store of a known size per
    /// token (a slice copy of a runtime length would be a `memmove` call per token).
    fn fill<const N: usize>(dst: &mut [u8], pad: u64) {
        let mut token = [0u8; N];
        token.copy_from_slice(&pad.to_le_bytes()[..N]);
        dst.as_chunks_mut::<N>().0.fill(token);
    }
    match itemsize {
        1 => fill::<1>(dst, pad),
        2 => fill::<2>(dst, pad),
        4 => fill::<4>(dst, pad),
        8 => fill::<8>(dst, pad),
        _ => {
            let bytes = pad.to_le_bytes();
            for token in dst.chunks_exact_mut(itemsize) {
                token.copy_from_slice(&bytes[..itemsize]);
            }
        }
    }
    seg.fill(0);
    pos.fill(0);
}

/// Segment ids and positions of the tokens the parts cover (each token's position inside its
/// document); tokens no part covers are left alone.
pub fn fill_segments(parts: &[Part], segments: &mut [i32], positions: &mut [i32]) {
    for p in parts {
        let at = p.flat as usize..(p.flat + p.length) as usize;
        segments[at.clone()].fill(p.segment);
        // A counting range zipped in, so that the loop vectorizes.
        let values = p.doc_pos as i64..(p.doc_pos + p.length) as i64;
        for (pos, value) in positions[at].iter_mut().zip(values) {
            *pos = value as i32;
        }
    }
}

/// The stored windows holding the document tokens of `parts`, pushed in part order as
/// `(record, first token in it, tokens, destination token)`. Document `doc` is stored from
/// record `first_record(doc)` on: as that one record when `piece_rows` is 0, else as records of
/// `piece_rows` tokens each but the last (a part may span several). `first_record` answers
/// `None` for a document it does not know, which ends the walk with that document as the error.
///
/// # Errors
/// The first document `first_record` does not know.
pub fn record_windows(
    parts: &[Part],
    first_record: impl Fn(u64) -> Option<u64>,
    piece_rows: u64,
    mut push: impl FnMut(u64, u64, u64, u64),
) -> Result<(), u64> {
    for p in parts.iter().filter(|p| p.content > 0) {
        let first = first_record(p.doc).ok_or(p.doc)?;
        if piece_rows == 0 {
            push(first, p.doc_pos, p.content, p.flat);
            continue;
        }
        let (mut at, end, mut to) = (p.doc_pos, p.doc_pos + p.content, p.flat);
        while at < end {
            let (piece, offset) = (at / piece_rows, at % piece_rows);
            let take = (piece_rows - offset).min(end - at);
            push(first + piece, offset, take, to);
            at += take;
            to += take;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Documents of lengths 3, 0, 5, 2 (with an end token each when `eos`).
    fn stream(eos: bool) -> Vec<i64> {
        let mut starts = vec![0i64];
        for len in [3i64, 0, 5, 2] {
            starts.push(starts.last().unwrap() + len + i64::from(eos));
        }
        starts
    }

    #[test]
    fn rows_cover_the_stream_token_by_token() {
        for eos in [false, true] {
            let starts = stream(eos);
            let total = *starts.last().unwrap() as u64;
            for seq_len in 1..=total {
                let rows: Vec<u64> = (0..total / seq_len).collect();
                let mut parts = Vec::new();
                concat_parts(&starts, |k| 10 + k as u64, seq_len, eos, &rows, &mut parts);
                let covered: u64 = parts.iter().map(|p| p.length).sum();
                assert_eq!(covered, rows.len() as u64 * seq_len, "eos {eos} seq_len {seq_len}");
                // Every stream token appears once, at its place, with its document position.
                let mut seen = vec![None; covered as usize];
                for p in &parts {
                    let k = (p.doc - 10) as usize;
                    for t in 0..p.length {
                        let stream_pos = starts[k] as u64 + p.doc_pos + t;
                        assert!(seen[(p.flat + t) as usize].replace(stream_pos).is_none());
                        assert_eq!(stream_pos, p.flat + t, "rows are the stream cut in order");
                    }
                    let own = (starts[k + 1] - starts[k]) as u64 - u64::from(eos);
                    assert_eq!(p.content, p.length.min(own.saturating_sub(p.doc_pos)));
                }
            }
        }
    }

    #[test]
    fn segments_count_the_documents_of_each_row_and_positions_continue() {
        let starts = stream(false); // 0..3 doc 0, doc 1 empty, 3..8 doc 2, 8..10 doc 3
        let mut parts = Vec::new();
        concat_parts(&starts, |k| k as u64, 4, false, &[0, 1], &mut parts);
        let (mut seg, mut pos) = (vec![0; 8], vec![0; 8]);
        fill_segments(&parts, &mut seg, &mut pos);
        assert_eq!(seg, [1, 1, 1, 2, 1, 1, 1, 1]);
        assert_eq!(pos, [0, 1, 2, 0, 1, 2, 3, 4]);
        assert_eq!(parts.iter().map(|p| p.doc).collect::<Vec<_>>(), [0, 2, 2]);
    }

    #[test]
    fn windows_follow_pieces_and_stop_at_an_unknown_document() {
        // Document 7 in pieces of 4 tokens from record 20: tokens 2..11 span pieces 0, 1, 2.
        let part = Part { doc: 7, doc_pos: 2, length: 10, content: 9, flat: 5, segment: 1 };
        let mut seen = Vec::new();
        let known = |d: u64| (d == 7).then_some(20);
        record_windows(&[part], known, 4, |r, s, n, t| seen.push((r, s, n, t))).unwrap();
        assert_eq!(seen, [(20, 2, 2, 5), (21, 0, 4, 7), (22, 0, 3, 11)]);
        seen.clear();
        record_windows(&[part], known, 0, |r, s, n, t| seen.push((r, s, n, t))).unwrap();
        assert_eq!(seen, [(20, 2, 9, 5)], "whole records: one window a part");
        let unknown = Part { doc: 8, ..part };
        assert_eq!(record_windows(&[part, unknown], known, 4, |_, _, _, _| {}), Err(8));
        let empty = Part { content: 0, ..unknown };
        assert_eq!(record_windows(&[empty], known, 4, |_, _, _, _| {}), Ok(()), "nothing read");
    }

    #[test]
    fn first_fit_rows_hold_their_documents_whole_and_padding_is_no_part() {
        // Rows: [doc 4 (3 tokens), doc 1 (2)], [doc 0 (5)], [] in rows of 6.
        let row_ptr = [0i64, 2, 3, 3];
        let row_docs = [4u64, 1, 0];
        let sizes = [5u64, 2, 9, 9, 3];
        let doc = |k: usize| row_docs.get(k).copied();
        let size = |d: u64| sizes.get(d as usize).copied();
        let mut parts = Vec::new();
        first_fit_parts(&row_ptr, doc, size, 6, true, &[1, 0, 2], &mut parts).unwrap();
        let got: Vec<_> =
            parts.iter().map(|p| (p.doc, p.flat, p.length, p.content, p.segment)).collect();
        assert_eq!(got, [(0, 0, 5, 4, 1), (4, 6, 3, 2, 1), (1, 9, 2, 1, 2)]);
        let (mut seg, mut pos) = (vec![0; 18], vec![0; 18]);
        fill_segments(&parts, &mut seg, &mut pos);
        assert_eq!(&seg[..12], [1, 1, 1, 1, 1, 0, 1, 1, 1, 2, 2, 0]);
        assert_eq!(&pos[6..12], [0, 1, 2, 0, 1, 0]);
        // A row past the table, or one whose documents do not fit, is refused by number.
        assert_eq!(first_fit_parts(&row_ptr, doc, size, 6, true, &[3], &mut parts), Err(3));
        assert_eq!(first_fit_parts(&row_ptr, doc, size, 4, true, &[1], &mut parts), Err(1));
    }
}
