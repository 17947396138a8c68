//! The prefix cache shared by all requests: keys and values of whole prompt
//! blocks, found by a hash chain of the tokens before and in each block (as
//! vLLM's automatic prefix caching), within a memory budget, least recently
//! used out first.
//!
//! Blocks are exactly the prefill chunks of the batching engine (same size,
//! same absolute boundaries), so a request that starts from cached blocks
//! computes the rest of its prompt with the very shapes a cold request
//! uses: the tokens come out the same.

use std::collections::HashMap;

use mlx_rs::ops::concatenate;
use mlx_rs::Array;

use crate::cache::KvCache;
use crate::disk::DiskTier;
use crate::error::Result;

/// Tokens per block, and per prefill chunk of the batching engine.
pub(crate) const BLOCK: usize = 128;

/// The hash of every whole block of `tokens`, each chained to the one
/// before (FNV-1a 64 over the previous hash and the block's ids): equal
/// hashes mean equal prefixes up to a collision, which lookups rule out by
/// comparing the stored tokens.
pub(crate) fn block_hashes(tokens: &[u32]) -> Vec<u64> {
    let mut prev = 0xcbf2_9ce4_8422_2325_u64;
    tokens
        .chunks_exact(BLOCK)
        .map(|block| {
            let mut h = prev;
            for byte in prev
                .to_le_bytes()
                .into_iter()
                .chain(block.iter().flat_map(|t| t.to_le_bytes()))
            {
                h ^= u64::from(byte);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
            prev = h;
            h
        })
        .collect()
}

/// One cached block: its tokens and, per layer, its keys and values
/// (`(1, kv_heads, BLOCK, head_dim)`).
struct Entry {
    tokens: Vec<u32>,
    layers: Vec<(Array, Array)>,
    bytes: usize,
    last_used: u64,
}

/// Cached blocks by chained hash, within `budget` bytes, and optionally
/// a disk tier behind them.
pub(crate) struct PrefixCache {
    blocks: HashMap<u64, Entry>,
    budget: usize,
    used: usize,
    clock: u64,
    disk: Option<DiskTier>,
    /// Blocks inserted since the last [`PrefixCache::persist`].
    unsaved: Vec<u64>,
}

impl PrefixCache {
    /// An empty cache holding at most `budget` bytes of keys and values
    /// (0 turns it off), backed by `disk` if given.
    pub(crate) fn new(budget: usize, disk: Option<DiskTier>) -> Self {
        Self {
            blocks: HashMap::new(),
            budget,
            used: 0,
            clock: 0,
            disk: disk.filter(|_| budget > 0),
            unsaved: Vec::new(),
        }
    }

    /// Whether blocks are kept at all.
    pub(crate) fn enabled(&self) -> bool {
        self.budget > 0
    }

    /// Whether the block of `hash` is held in memory.
    pub(crate) fn contains(&self, hash: u64) -> bool {
        self.blocks.contains_key(&hash)
    }

    /// The longest run of cached blocks (in memory, else on disk) at the
    /// start of `tokens` (whose block hashes are `hashes`), as one cache
    /// per layer; `None` when the first block is not cached.
    pub(crate) fn restore(
        &mut self,
        tokens: &[u32],
        hashes: &[u64],
    ) -> Result<Option<(usize, Vec<KvCache>)>> {
        if !self.enabled() {
            return Ok(None);
        }
        let mut run: Vec<Vec<(Array, Array)>> = Vec::new();
        for (i, &h) in hashes.iter().enumerate() {
            let block = &tokens[i * BLOCK..(i + 1) * BLOCK];
            match self.blocks.get(&h) {
                Some(e) if e.tokens == block => run.push(e.layers.clone()),
                Some(_) => break,
                None => match self.disk.as_mut().and_then(|d| d.load(h, block)) {
                    Some(layers) => {
                        run.push(layers.clone());
                        self.put(h, block.to_vec(), layers);
                    }
                    None => break,
                },
            }
        }
        let found = run.len();
        if found == 0 {
            return Ok(None);
        }
        // Later blocks are touched first, so the first blocks of a chain
        // are the most recent and a chain is evicted from its end.
        for h in hashes[..found].iter().rev() {
            self.clock += 1;
            if let Some(e) = self.blocks.get_mut(h) {
                e.last_used = self.clock;
            }
        }
        let layers = run[0].len();
        let caches = (0..layers)
            .map(|layer| {
                let (keys, values): (Vec<&Array>, Vec<&Array>) =
                    run.iter().map(|b| (&b[layer].0, &b[layer].1)).unzip();
                Ok(KvCache::from_state(
                    concatenate(&keys, 2)?,
                    concatenate(&values, 2)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Some((found * BLOCK, caches)))
    }

    /// Keeps the block `index` of `tokens` (hash `hash`): per layer, copies
    /// of its keys and values `(1, kv_heads, BLOCK, head_dim)`, sharing no
    /// memory with a cache or pool. The copies may be lazy: the caller
    /// evaluates the returned arrays with the step that fills them, and
    /// writes them to disk with [`PrefixCache::persist`] once it is done.
    pub(crate) fn insert(
        &mut self,
        hash: u64,
        index: usize,
        tokens: &[u32],
        layers: Vec<(Array, Array)>,
    ) -> Result<Vec<Array>> {
        if !self.enabled() || self.blocks.contains_key(&hash) {
            return Ok(Vec::new());
        }
        let arrays = layers
            .iter()
            .flat_map(|(k, v)| [k.clone(), v.clone()])
            .collect();
        let block = tokens[index * BLOCK..(index + 1) * BLOCK].to_vec();
        self.put(hash, block, layers);
        if self.disk.as_ref().is_some_and(|d| !d.contains(hash)) {
            self.unsaved.push(hash);
        }
        Ok(arrays)
    }

    /// The blocks inserted since the last call, not yet on disk.
    pub(crate) fn take_unsaved(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.unsaved)
    }

    /// Writes blocks `hashes` (from [`PrefixCache::take_unsaved`]) to the
    /// disk tier; the step that computed them must be done.
    pub(crate) fn persist(&mut self, hashes: Vec<u64>) -> Result<()> {
        let Some(disk) = self.disk.as_mut() else {
            return Ok(());
        };
        for hash in hashes {
            if let Some(e) = self.blocks.get(&hash) {
                disk.store(hash, &e.tokens, &e.layers)?;
            }
        }
        Ok(())
    }

    fn put(&mut self, hash: u64, tokens: Vec<u32>, layers: Vec<(Array, Array)>) {
        let bytes = layers
            .iter()
            .map(|(k, v)| k.nbytes() + v.nbytes())
            .sum::<usize>();
        self.clock += 1;
        self.used += bytes;
        self.blocks.insert(
            hash,
            Entry {
                tokens,
                layers,
                bytes,
                last_used: self.clock,
            },
        );
        self.evict();
    }

    /// Drops the least recently used blocks until the budget holds.
    fn evict(&mut self) {
        while self.used > self.budget {
            let Some((&oldest, _)) = self.blocks.iter().min_by_key(|(_, e)| e.last_used) else {
                break;
            };
            if let Some(e) = self.blocks.remove(&oldest) {
                self.used -= e.bytes;
            }
        }
    }

    /// Bytes of keys and values held.
    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        self.used
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys and values of two layers for positions `start..end` of one
    /// head of width 2: position `p` of layer `l` holds `[2p + l, 2p + 1 + l]`.
    fn layers(start: usize, end: usize) -> Vec<(Array, Array)> {
        (0..2)
            .map(|layer| {
                let kv = mlx_rs::ops::arange::<_, f32>((start * 2) as f64, (end * 2) as f64, None)
                    .unwrap()
                    .add(Array::from_f32(layer as f32))
                    .unwrap()
                    .reshape(&[1, 1, (end - start) as i32, 2])
                    .unwrap();
                (kv.clone(), kv)
            })
            .collect()
    }

    #[test]
    fn restores_the_longest_cached_run_and_evicts_within_budget() {
        let tokens: Vec<u32> = (0..(2 * BLOCK) as u32).collect();
        let hashes = block_hashes(&tokens);
        // One block: 2 layers x keys and values x BLOCK x 2 floats.
        let block_bytes = 2 * 2 * BLOCK * 2 * 4;
        let mut cache = PrefixCache::new(2 * block_bytes, None);
        for (i, h) in hashes.iter().enumerate() {
            let block = layers(i * BLOCK, (i + 1) * BLOCK);
            let arrays = cache.insert(*h, i, &tokens, block).unwrap();
            mlx_rs::transforms::eval(arrays.iter()).unwrap();
        }
        assert_eq!(cache.used(), 2 * block_bytes);
        let (n, restored) = cache.restore(&tokens, &hashes).unwrap().unwrap();
        assert_eq!(n, 2 * BLOCK);
        assert_eq!(restored[1].offset(), 2 * BLOCK as i32);
        let (k, _) = restored[1].valid().unwrap().unwrap();
        assert!(k.eq_values(&layers(0, 2 * BLOCK)[1].0).unwrap());

        // Other tokens with the same hashes (a collision) are not served.
        let mut other = tokens.clone();
        other[0] = 9999;
        assert!(cache.restore(&other, &hashes).unwrap().is_none());

        // A third block evicts the least recently used: the chain's end.
        let more: Vec<u32> = (0..(2 * BLOCK) as u32).rev().collect();
        let more_hashes = block_hashes(&more);
        cache
            .insert(more_hashes[0], 0, &more, layers(0, BLOCK))
            .unwrap();
        assert_eq!(cache.used(), 2 * block_bytes);
        let (n, _) = cache.restore(&tokens, &hashes).unwrap().unwrap();
        assert_eq!(n, BLOCK);
    }

    #[test]
    fn hashes_chain_over_whole_blocks_only() {
        let a: Vec<u32> = (0..(2 * BLOCK + 5) as u32).collect();
        let mut b = a.clone();
        b[BLOCK + 3] = 9999;
        let (ha, hb) = (block_hashes(&a), block_hashes(&b));
        assert_eq!(ha.len(), 2);
        assert_eq!(ha[0], hb[0]);
        assert_ne!(ha[1], hb[1]);
        // The second block's hash depends on the first block too.
        let mut c = a.clone();
        c[0] = 7777;
        assert_ne!(block_hashes(&c)[1], ha[1]);
    }
}
