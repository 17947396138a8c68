//! SHA-256 whose running state can be kept beside a partial download, so
//! that a resumed pull hashes only what arrives, not again the part it
//! already hashed as that part arrived.
//!
//! The trade-off: the bytes of a partial file that a checkpoint covers are
//! not read back, so a change to them on disk between the pulls (bit rot,
//! another program writing the file) would go unseen. Without a checkpoint
//! (a pull killed before it wrote one), the part on disk is hashed whole,
//! as before.

use sha2::digest::consts::U64;
use sha2::digest::generic_array::GenericArray;

/// The initial hash value (FIPS 180-4, 5.3.3).
const H0: [u32; 8] = [
    0x6a09_e667,
    0xbb67_ae85,
    0x3c6e_f372,
    0xa54f_f53a,
    0x510e_527f,
    0x9b05_688c,
    0x1f83_d9ab,
    0x5be0_cd19,
];

/// What a checkpoint file starts with.
const MAGIC: &[u8] = b"hangar-sha256 1\n";

/// Blocks compressed per call: the bytes are copied into whole blocks
/// first (a copy costs a fraction of the hashing).
const BATCH: usize = 64;

/// A SHA-256 in progress.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Sha256 {
    state: [u32; 8],
    /// Bytes fed so far.
    len: u64,
    /// The bytes of the block not yet full: the first `len % 64`.
    pending: [u8; 64],
}

impl Default for Sha256 {
    fn default() -> Sha256 {
        Sha256 {
            state: H0,
            len: 0,
            pending: [0; 64],
        }
    }
}

impl Sha256 {
    /// The bytes fed so far.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    pub(crate) fn update(&mut self, mut data: &[u8]) {
        let fill = (self.len % 64) as usize;
        self.len += data.len() as u64;
        if fill > 0 {
            let take = (64 - fill).min(data.len());
            self.pending[fill..fill + take].copy_from_slice(&data[..take]);
            data = &data[take..];
            if fill + take < 64 {
                return;
            }
            let block = self.pending;
            compress(&mut self.state, &block);
        }
        let mut blocks = data.chunks_exact(64);
        let mut batch = [GenericArray::<u8, U64>::default(); BATCH];
        loop {
            let mut n = 0;
            for (slot, block) in batch.iter_mut().zip(&mut blocks) {
                slot.copy_from_slice(block);
                n += 1;
            }
            if n == 0 {
                break;
            }
            sha2::compress256(&mut self.state, &batch[..n]);
        }
        let rest = blocks.remainder();
        self.pending[..rest.len()].copy_from_slice(rest);
    }

    /// The digest of what was fed.
    pub(crate) fn finalize(self) -> [u8; 32] {
        let mut state = self.state;
        let fill = (self.len % 64) as usize;
        let mut block = [0u8; 64];
        block[..fill].copy_from_slice(&self.pending[..fill]);
        block[fill] = 0x80;
        if fill >= 56 {
            compress(&mut state, &block);
            block = [0; 64];
        }
        block[56..].copy_from_slice(&self.len.wrapping_mul(8).to_be_bytes());
        compress(&mut state, &block);
        let mut out = [0u8; 32];
        for (bytes, word) in out.chunks_exact_mut(4).zip(state) {
            bytes.copy_from_slice(&word.to_be_bytes());
        }
        out
    }

    /// The state as a checkpoint file holds it.
    pub(crate) fn checkpoint(&self) -> Vec<u8> {
        let fill = (self.len % 64) as usize;
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&self.len.to_le_bytes());
        for word in self.state {
            out.extend_from_slice(&word.to_le_bytes());
        }
        out.extend_from_slice(&self.pending[..fill]);
        out
    }

    /// The state a checkpoint holds, or `None` when it is not one (torn,
    /// or of another version).
    pub(crate) fn from_checkpoint(bytes: &[u8]) -> Option<Sha256> {
        let rest = bytes.strip_prefix(MAGIC)?;
        let len = u64::from_le_bytes(rest.get(..8)?.try_into().ok()?);
        let words = rest.get(8..40)?;
        let fill = (len % 64) as usize;
        let pending_bytes = rest.get(40..)?;
        if pending_bytes.len() != fill {
            return None;
        }
        let mut state = [0u32; 8];
        for (word, bytes) in state.iter_mut().zip(words.chunks_exact(4)) {
            *word = u32::from_le_bytes(bytes.try_into().ok()?);
        }
        let mut pending = [0u8; 64];
        pending[..fill].copy_from_slice(pending_bytes);
        Some(Sha256 {
            state,
            len,
            pending,
        })
    }
}

fn compress(state: &mut [u32; 8], block: &[u8; 64]) {
    sha2::compress256(state, std::slice::from_ref(GenericArray::from_slice(block)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::Digest;

    #[test]
    fn it_is_sha256_however_the_bytes_are_cut_and_resumed() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        for len in [0, 1, 55, 56, 63, 64, 65, 119, 120, 4096, 4160, 10_000] {
            let data = &data[..len];
            let want: [u8; 32] = sha2::Sha256::digest(data).into();
            for cut in [0, 1, 63, 64, 100, 4097].map(|c: usize| c.min(len)) {
                let mut h = Sha256::default();
                h.update(&data[..cut]);
                // Kept and read back, as across two pulls.
                let mut h = Sha256::from_checkpoint(&h.checkpoint()).expect("a checkpoint");
                assert_eq!(h.len(), cut as u64);
                for piece in data[cut..].chunks(37) {
                    h.update(piece);
                }
                assert_eq!(h.finalize(), want, "len {len}, cut {cut}");
            }
        }
    }

    #[test]
    fn a_torn_checkpoint_is_none() {
        let mut h = Sha256::default();
        h.update(b"hello");
        let whole = h.checkpoint();
        assert!(Sha256::from_checkpoint(&whole).is_some());
        for cut in [0, 10, MAGIC.len() + 8, whole.len() - 1] {
            assert_eq!(Sha256::from_checkpoint(&whole[..cut]), None, "cut {cut}");
        }
        assert_eq!(
            Sha256::from_checkpoint(&[whole.as_slice(), b"x"].concat()),
            None
        );
    }
}
