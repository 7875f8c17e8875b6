//! `gather_block_rows`: rows of a *block store*, the store of a dataset directory's column
//! group. Record `b` of such a store holds rows `b * block_rows ..` of the group, each
//! `row_len` bytes, row-major (the last record may hold fewer). A row is a window of its block,
//! so the table entry and the per-record checks are paid once per block, not once per value:
//! a table of 40 narrow columns costs one 16-byte entry per block instead of 40 per row.
//!
//! The caller passes the row count it was given (the dataset's commit point), never the one
//! the store has now: rows appended past it by a writer that has not committed are refused
//! like any other row out of range, so every reader of a generation reads the same rows. The
//! store holds full blocks only; the rows after the last full one (fewer than a block) are the
//! commit point's *tail*, kept with it (in the manifest) and passed in by the caller, so that an
//! append never rewrites a block: it fills the tail into full blocks and leaves a new tail.

use crate::chunks::Chunk;
use crate::codec::{copy_bytes, Decoder};
use crate::error::{Error, Result};
use crate::format::{Codec, RecordLoc};
use crate::gather::for_record;
use crate::pool::run_sharded_at_most;
use crate::store::Store;
use crate::sums::Verdict;

/// How a block store's rows are laid out: rows per block, bytes per row, and the rows the
/// caller's commit point holds.
#[derive(Clone, Copy, Debug)]
pub struct BlockLayout {
    pub block_rows: u64,
    pub row_len: usize,
    pub rows: u64,
}

/// One row to read: the row and its slice of the destination.
struct RowSlot<'d> {
    row: u64,
    dst: &'d mut [u8],
}

impl Store {
    /// Copies row `rows[i]` into `dst[i * row_len..][..row_len]` for every `i`, in at most
    /// `max_shards` parallel blocks: the last `tail.len() / row_len` rows below `layout.rows`
    /// from `tail`, the others from the store's blocks. Every row must be below `layout.rows`,
    /// the rows before the tail must fill whole blocks, and each block must hold its rows (a
    /// block shorter than its rows is a corrupt store); a refused call writes nothing.
    /// Compressed blocks are decoded once per shard and run of rows in the same block, so
    /// random rows of a compressed group cost a block decode each: groups meant for random
    /// access are raw.
    pub fn gather_block_rows(
        &self,
        rows: &[u64],
        layout: BlockLayout,
        tail: &[u8],
        dst: &mut [u8],
        max_shards: usize,
    ) -> Result<()> {
        let _guard = self.activity.shared("gather")?;
        let BlockLayout { block_rows, row_len, rows: count } = layout;
        if block_rows == 0 || row_len == 0 {
            return Err(Error::invalid(
                "a block store has at least one row a block and one byte a row",
            ));
        }
        if rows.len().checked_mul(row_len) != Some(dst.len()) {
            return Err(Error::invalid(format!(
                "{} rows of {row_len} bytes do not fill a destination of {} bytes",
                rows.len(),
                dst.len()
            )));
        }
        if let Some(&row) = rows.iter().find(|&&r| r >= count) {
            return Err(Error::IndexOutOfRange { index: row, len: count });
        }
        let tail_rows = (tail.len() / row_len) as u64;
        if !tail.len().is_multiple_of(row_len)
            || tail_rows > count
            || !(count - tail_rows).is_multiple_of(block_rows)
        {
            return Err(Error::invalid(format!(
                "a tail of {} bytes is not the rows after the full blocks of {count} rows \
                 ({block_rows} rows of {row_len} bytes a block)",
                tail.len()
            )));
        }
        let in_blocks = count - tail_rows;
        self.consistent_read(|| {
            let blocks = self.len();
            let needed = in_blocks / block_rows;
            if needed > blocks {
                return Err(Error::corrupt(
                    &self.meta_path,
                    format!(
                        "the group holds {in_blocks} rows in blocks, {needed} blocks of \
                         {block_rows}, but its store has {blocks} records"
                    ),
                ));
            }
            let mut slots: Vec<RowSlot<'_>> = dst
                .chunks_exact_mut(row_len)
                .zip(rows)
                .map(|(dst, &row)| RowSlot { row, dst })
                .collect();
            let sums = self.checked_reads();
            let dict = self.dictionary();
            run_sharded_at_most(&mut slots, dst_len(rows.len(), row_len), max_shards, |part| {
                let mut raw_chunk: Option<(u16, &Chunk)> = None;
                let mut decoded = DecodedBlock::default();
                let mut decoder = Decoder::new(dict);
                for s in part.iter_mut() {
                    if s.row >= in_blocks {
                        let at = (s.row - in_blocks) as usize * row_len;
                        s.dst.copy_from_slice(&tail[at..at + row_len]);
                        continue;
                    }
                    let block = s.row / block_rows;
                    let start = (s.row % block_rows) as usize * row_len;
                    let loc = self.meta.entry(block);
                    let end = start + row_len;
                    if end > loc.logic_length as usize {
                        return Err(Error::corrupt(
                            &self.meta_path,
                            format!(
                                "block {block} holds {} bytes, too few for row {} of \
                                 {row_len} bytes",
                                loc.logic_length, s.row
                            ),
                        ));
                    }
                    if sums.is_none()
                        && loc.codec == Codec::Raw as u8
                        && loc.phys_length == loc.logic_length
                    {
                        let chunk = match raw_chunk {
                            Some((id, chunk)) if id == loc.chunk_id => chunk,
                            _ => {
                                let Some((_, chunk)) = self.locate(block, &loc)? else {
                                    continue;
                                };
                                raw_chunk = Some((loc.chunk_id, chunk));
                                chunk
                            }
                        };
                        let at = u64::from(loc.offset) + start as u64;
                        let bytes =
                            chunk.read(at, row_len as u64).map_err(|e| for_record(e, block))?;
                        copy_bytes(s.dst, bytes);
                        continue;
                    }
                    let whole = decoded.get(self, block, &loc, &mut decoder, sums.is_some())?;
                    s.dst.copy_from_slice(&whole[start..end]);
                }
                Ok(())
            })
        })
    }
}

fn dst_len(rows: usize, row_len: usize) -> usize {
    rows.saturating_mul(row_len)
}

/// The last block a shard decoded, kept while its rows follow in the same block.
#[derive(Default)]
struct DecodedBlock {
    block: Option<u64>,
    bytes: Vec<u8>,
}

impl DecodedBlock {
    fn get(
        &mut self,
        store: &Store,
        block: u64,
        loc: &RecordLoc,
        decoder: &mut Decoder,
        checked: bool,
    ) -> Result<&[u8]> {
        if self.block != Some(block) {
            self.block = None;
            self.bytes.resize(loc.logic_length as usize, 0);
            store.read_record(block, loc, &mut self.bytes, decoder)?;
            if checked {
                if let Some(sums) = store.checked_reads() {
                    if sums.check(block, loc, &self.bytes) == Verdict::Bad {
                        let path = store.chunks.path(u64::from(loc.chunk_id));
                        return Err(Error::checksum_mismatch(path, block));
                    }
                }
            }
            self.block = Some(block);
        }
        Ok(&self.bytes)
    }
}
