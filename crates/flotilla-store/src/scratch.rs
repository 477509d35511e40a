//! A redb storage backend that reads a file and never writes it.
//!
//! redb cannot read a file that was not closed cleanly without recovering it first, and
//! recovery writes (the header, the allocator state): a read-only open refuses such a file
//! ([`redb::DatabaseError::RepairAborted`]). Opened through [`Scratch`], redb recovers it
//! in memory instead: every write lands in memory pages laid over the file, and reads see
//! those pages over the file's own bytes. The store uses it to check every record of an
//! unclean file before the writable open that recovers it for real, so that a damaged
//! unclean file is refused without a byte of it changed.
//!
//! Its locks are the store's lock on the file (a [`LockedBackend`]), held before redb opens
//! the file through a `Scratch` and after it closes it, so no other opener has the file
//! meanwhile.

use std::collections::BTreeMap;
use std::io;
use std::ops::Bound;
use std::sync::{Mutex, MutexGuard, PoisonError};

use redb::{BackendError, StorageBackend};

use crate::lock::LockedBackend;

/// The size of the memory pages laid over the file (redb's page size; any size works).
const BLOCK: u64 = 4096;

/// Reads from a file, writes to memory: see the module's documentation.
#[derive(Debug)]
pub(crate) struct Scratch {
    /// The file, for reads and locks only; never written.
    file: LockedBackend,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// The length redb sees.
    len: u64,
    /// The file's bytes below this offset show where no block was written; above it they
    /// read as zeros (redb shrank the storage below it, and may have grown it again).
    file_visible: u64,
    /// Written blocks, by index: each `BLOCK` bytes, the whole block as it now reads.
    blocks: BTreeMap<u64, Box<[u8]>>,
}

impl Scratch {
    /// Lay an empty overlay over `file`; redb will see the file as it is now.
    pub(crate) fn new(file: LockedBackend) -> io::Result<Scratch> {
        let len = file.len()?;
        Ok(Scratch {
            file,
            state: Mutex::new(State {
                len,
                file_visible: len,
                blocks: BTreeMap::new(),
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Fill `out` with the bytes at `offset` as the file has them, zeros above
    /// `file_visible`.
    fn read_file(&self, file_visible: u64, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let from_file = usize::try_from(file_visible.saturating_sub(offset))
            .unwrap_or(usize::MAX)
            .min(out.len());
        let (shown, zeros) = out.split_at_mut(from_file);
        if !shown.is_empty() {
            self.file.read(offset, shown)?;
        }
        zeros.fill(0);
        Ok(())
    }

    /// The block `index` as it reads now, for a write into it.
    fn block_mut<'s>(&self, state: &'s mut State, index: u64) -> io::Result<&'s mut [u8]> {
        if !state.blocks.contains_key(&index) {
            let mut block = vec![0; BLOCK as usize].into_boxed_slice();
            self.read_file(state.file_visible, index * BLOCK, &mut block)?;
            state.blocks.insert(index, block);
        }
        state
            .blocks
            .get_mut(&index)
            .map(|b| &mut b[..])
            .ok_or_else(|| io::Error::other("scratch block vanished"))
    }
}

/// The blocks spanned by `len` bytes at `offset`, each as (index, offset in the block,
/// offset in the span, length).
fn spans(offset: u64, len: usize) -> impl Iterator<Item = (u64, usize, usize, usize)> {
    let end = offset.saturating_add(len as u64);
    let mut at = offset;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let index = at / BLOCK;
        let in_block = (at % BLOCK) as usize;
        let n = (BLOCK - at % BLOCK).min(end - at) as usize;
        let in_span = (at - offset) as usize;
        at += n as u64;
        Some((index, in_block, in_span, n))
    })
}

fn past_the_end(offset: u64, len: usize, storage: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!("read of {len} bytes at {offset} past the end of the storage ({storage} bytes)"),
    )
}

impl StorageBackend for Scratch {
    fn len(&self) -> Result<u64, io::Error> {
        Ok(self.state().len)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        let state = self.state();
        if offset.saturating_add(out.len() as u64) > state.len {
            return Err(past_the_end(offset, out.len(), state.len));
        }
        for (index, in_block, in_span, n) in spans(offset, out.len()) {
            let part = &mut out[in_span..in_span + n];
            match state.blocks.get(&index) {
                Some(block) => part.copy_from_slice(&block[in_block..in_block + n]),
                None => {
                    self.read_file(state.file_visible, index * BLOCK + in_block as u64, part)?
                }
            }
        }
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        let mut state = self.state();
        if len < state.len {
            // What is cut off reads as zeros if the storage grows again.
            let first_gone = len.div_ceil(BLOCK);
            state.blocks.retain(|&index, _| index < first_gone);
            if let Some(block) = state.blocks.get_mut(&(len / BLOCK)) {
                block[(len % BLOCK) as usize..].fill(0);
            }
            state.file_visible = state.file_visible.min(len);
        }
        state.len = len;
        Ok(())
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        let mut state = self.state();
        for (index, in_block, in_span, n) in spans(offset, data.len()) {
            let block = self.block_mut(&mut state, index)?;
            block[in_block..in_block + n].copy_from_slice(&data[in_span..in_span + n]);
        }
        state.len = state.len.max(offset.saturating_add(data.len() as u64));
        Ok(())
    }

    fn close(&self) -> Result<(), io::Error> {
        self.file.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.file.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.query_lock_range(start, end)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::lock::LockedFile;

    /// A file of `len` bytes, byte i = i mod 251, and a scratch over it.
    fn scratch(len: usize) -> (tempfile::NamedTempFile, Vec<u8>, Scratch) {
        let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(&bytes).unwrap();
        let locked = LockedFile::lock(file.path(), file.reopen().unwrap()).unwrap();
        let scratch = Scratch::new(locked).unwrap();
        (file, bytes, scratch)
    }

    fn read(s: &Scratch, offset: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0xaa; len];
        s.read(offset, &mut out).unwrap();
        out
    }

    #[test]
    fn reads_see_writes_over_the_file_and_the_file_is_untouched() {
        let (file, bytes, s) = scratch(3 * BLOCK as usize + 100);
        assert_eq!(s.len().unwrap(), bytes.len() as u64);
        assert_eq!(read(&s, 0, bytes.len()), bytes);

        // A write across a block boundary, and one past the end.
        s.write(BLOCK - 2, &[1, 2, 3, 4]).unwrap();
        let end = bytes.len() as u64;
        s.write(end + 10, &[9; 5]).unwrap();
        let mut expected = bytes.clone();
        expected[BLOCK as usize - 2..BLOCK as usize + 2].copy_from_slice(&[1, 2, 3, 4]);
        expected.resize(bytes.len() + 15, 0);
        expected[bytes.len() + 10..].copy_from_slice(&[9; 5]);
        assert_eq!(s.len().unwrap(), expected.len() as u64);
        assert_eq!(read(&s, 0, expected.len()), expected);
        assert_eq!(read(&s, BLOCK - 3, 6), expected[BLOCK as usize - 3..][..6]);

        s.sync_data().unwrap();
        s.close().unwrap();
        assert_eq!(std::fs::read(file.path()).unwrap(), bytes);
    }

    #[test]
    fn a_read_past_the_end_fails() {
        let (_file, _, s) = scratch(100);
        let mut out = [0; 2];
        let err = s.read(99, &mut out).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn what_shrinking_cut_off_reads_as_zeros_when_grown_again() {
        let (_file, bytes, s) = scratch(2 * BLOCK as usize);
        s.write(BLOCK + 10, &[7; 20]).unwrap();
        // Cut inside the written block and inside the file's first block.
        s.set_len(BLOCK + 15).unwrap();
        s.set_len(BLOCK / 2).unwrap();
        assert_eq!(s.len().unwrap(), BLOCK / 2);
        s.set_len(2 * BLOCK).unwrap();
        let mut expected = bytes[..BLOCK as usize / 2].to_vec();
        expected.resize(2 * BLOCK as usize, 0);
        assert_eq!(read(&s, 0, expected.len()), expected);
        // A write into a block the file no longer shows starts from zeros.
        s.write(BLOCK, &[5]).unwrap();
        expected[BLOCK as usize] = 5;
        assert_eq!(read(&s, 0, expected.len()), expected);
    }
}
