//! The prefix cache's disk tier: one checksummed file per block under a
//! folder of the host's state dir, within a byte budget, least recently
//! used out first; it survives unloading the model and restarting the host.
//!
//! A file names the model it was computed with (a fingerprint of
//! `config.json` and the weight files' names, sizes and modification
//! times), the block's hash and its tokens. A file that is damaged, cut
//! short, or from another model is deleted and its block recomputed: never
//! served. Keys and values are stored as little-endian float32, which holds
//! float16 and bfloat16 values exactly, and restored to the model's dtype.
//!
//! File layout: `HANGARKV`, a u32 format version, a u32 header length, the
//! JSON header, the payload (every layer's keys then values, float32), and
//! the FNV-1a 64 checksum of header and payload.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::SystemTime;

use mlx_rs::{Array, Dtype};
use serde::{Deserialize, Serialize};

const MAGIC: &[u8; 8] = b"HANGARKV";
const VERSION: u32 = 1;

/// FNV-1a 64 of `bytes`, continuing from `h`.
fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// What a block file says about itself.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Header {
    /// The model fingerprint.
    model: String,
    /// The block's chained hash, in hex.
    hash: String,
    /// The block's tokens.
    tokens: Vec<u32>,
    /// The cache's dtype, restored on load.
    dtype: String,
    /// Shape of each layer's keys and of its values.
    key_shape: Vec<i32>,
    value_shape: Vec<i32>,
    layers: usize,
}

/// A fingerprint of the model in `dir`: the bytes of `config.json` and
/// the names, sizes and modification times of its weight files.
pub(crate) fn model_fingerprint(dir: &Path) -> String {
    let mut h = fnv(
        FNV_START,
        &std::fs::read(dir.join("config.json")).unwrap_or_default(),
    );
    let mut weights: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
        .collect();
    weights.sort_by_key(|e| e.file_name());
    for e in weights {
        h = fnv(h, e.file_name().to_string_lossy().as_bytes());
        if let Ok(meta) = e.metadata() {
            h = fnv(h, &meta.len().to_le_bytes());
            let modified = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            h = fnv(h, &modified.to_le_bytes());
        }
    }
    format!("{h:016x}")
}

/// Block files of one model, by hash.
pub(crate) struct DiskTier {
    dir: PathBuf,
    model: String,
    budget: u64,
    used: u64,
    /// Size and last use of every file.
    files: HashMap<u64, (u64, SystemTime)>,
    writes: Option<mpsc::Sender<(PathBuf, Vec<u8>)>>,
    writer: Option<std::thread::JoinHandle<()>>,
}

impl DiskTier {
    /// The tier in `root/<fingerprint>` for the model in `model_dir`,
    /// holding at most `budget` bytes; `None` when the folder cannot be
    /// made (the cache then lives in memory only).
    pub(crate) fn open(root: &Path, model_dir: &Path, budget: u64) -> Option<Self> {
        let model = model_fingerprint(model_dir);
        let dir = root.join(&model);
        std::fs::create_dir_all(&dir).ok()?;
        let mut files = HashMap::new();
        let mut used = 0;
        for entry in std::fs::read_dir(&dir).ok()?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let hash = name
                .strip_suffix(".kv")
                .and_then(|h| u64::from_str_radix(h, 16).ok());
            match (hash, entry.metadata()) {
                (Some(hash), Ok(meta)) if meta.is_file() => {
                    used += meta.len();
                    let when = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                    files.insert(hash, (meta.len(), when));
                }
                // Leftovers of an interrupted write, or foreign files.
                _ => {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        let (writes, inbox) = mpsc::channel::<(PathBuf, Vec<u8>)>();
        // Files are written off the engine thread: a step never waits for
        // the disk. Each goes to a temporary name first, so a crash leaves
        // no half file under a block's name.
        let writer = std::thread::Builder::new()
            .name("native-mlx-kv-writer".into())
            .spawn(move || {
                for (path, bytes) in inbox {
                    let tmp = path.with_extension("tmp");
                    let written = std::fs::File::create(&tmp)
                        .and_then(|mut f| f.write_all(&bytes))
                        .and_then(|()| std::fs::rename(&tmp, &path));
                    if written.is_err() {
                        let _ = std::fs::remove_file(&tmp);
                    }
                }
            })
            .ok()?;
        let mut tier = Self {
            dir,
            model,
            budget,
            used,
            files,
            writes: Some(writes),
            writer: Some(writer),
        };
        tier.evict();
        Some(tier)
    }

    fn path(&self, hash: u64) -> PathBuf {
        self.dir.join(format!("{hash:016x}.kv"))
    }

    /// Whether a file for `hash` is held.
    pub(crate) fn contains(&self, hash: u64) -> bool {
        self.files.contains_key(&hash)
    }

    /// Writes block `hash` (`tokens`, per layer keys and values, evaluated).
    pub(crate) fn store(
        &mut self,
        hash: u64,
        tokens: &[u32],
        layers: &[(Array, Array)],
    ) -> crate::Result<()> {
        if self.files.contains_key(&hash) || layers.is_empty() {
            return Ok(());
        }
        let (k0, v0) = &layers[0];
        let header = Header {
            model: self.model.clone(),
            hash: format!("{hash:016x}"),
            tokens: tokens.to_vec(),
            dtype: format!("{:?}", k0.dtype()),
            key_shape: k0.shape().to_vec(),
            value_shape: v0.shape().to_vec(),
            layers: layers.len(),
        };
        let header = serde_json::to_vec(&header).expect("headers serialize");
        let mut bytes =
            Vec::with_capacity(16 + header.len() + layers.len() * 4 * (k0.size() + v0.size()) + 8);
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&VERSION.to_le_bytes());
        bytes.extend_from_slice(&(header.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&header);
        for (k, v) in layers {
            for a in [k, v] {
                let a = a.as_dtype(Dtype::Float32)?;
                a.eval()?;
                let values = a
                    .try_as_slice::<f32>()
                    .map_err(|e| mlx_rs::error::Exception::custom(e.to_string()))?;
                for x in values {
                    bytes.extend_from_slice(&x.to_le_bytes());
                }
            }
        }
        let sum = fnv(FNV_START, &bytes[16..]);
        bytes.extend_from_slice(&sum.to_le_bytes());
        let size = bytes.len() as u64;
        if size > self.budget {
            return Ok(());
        }
        if let Some(writes) = &self.writes {
            if writes.send((self.path(hash), bytes)).is_ok() {
                self.used += size;
                self.files.insert(hash, (size, SystemTime::now()));
                self.evict();
            }
        }
        Ok(())
    }

    /// Reads block `hash`, which must hold `tokens`, as per-layer keys and
    /// values; a file that fails any check is deleted.
    pub(crate) fn load(&mut self, hash: u64, tokens: &[u32]) -> Option<Vec<(Array, Array)>> {
        self.files.get(&hash)?;
        let path = self.path(hash);
        match std::fs::read(&path)
            .ok()
            .and_then(|b| self.parse(&b, hash, tokens))
        {
            Some(layers) => {
                let now = SystemTime::now();
                if let Some(entry) = self.files.get_mut(&hash) {
                    entry.1 = now;
                }
                // The file's time is its place in the LRU after a restart.
                if let Ok(f) = std::fs::File::options().append(true).open(&path) {
                    let _ = f.set_modified(now);
                }
                Some(layers)
            }
            None => {
                self.remove(hash);
                None
            }
        }
    }

    fn parse(&self, bytes: &[u8], hash: u64, tokens: &[u32]) -> Option<Vec<(Array, Array)>> {
        if bytes.len() < 24 || &bytes[..8] != MAGIC {
            return None;
        }
        let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        if word(8) != VERSION {
            return None;
        }
        let header_len = word(12) as usize;
        let body_end = bytes.len() - 8;
        if 16 + header_len > body_end {
            return None;
        }
        let sum = u64::from_le_bytes(bytes[body_end..].try_into().expect("8 bytes"));
        if fnv(FNV_START, &bytes[16..body_end]) != sum {
            return None;
        }
        let header: Header = serde_json::from_slice(&bytes[16..16 + header_len]).ok()?;
        if header.model != self.model
            || header.hash != format!("{hash:016x}")
            || header.tokens != tokens
        {
            return None;
        }
        let dtype = match header.dtype.as_str() {
            "Float32" => Dtype::Float32,
            "Float16" => Dtype::Float16,
            "Bfloat16" => Dtype::Bfloat16,
            _ => return None,
        };
        let count = |shape: &[i32]| -> Option<usize> {
            shape
                .iter()
                .try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d).ok()?))
        };
        let (k_len, v_len) = (count(&header.key_shape)?, count(&header.value_shape)?);
        let payload = &bytes[16 + header_len..body_end];
        if payload.len() != header.layers * 4 * (k_len + v_len) {
            return None;
        }
        let floats: Vec<f32> = payload
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        let mut layers = Vec::with_capacity(header.layers);
        let mut at = 0;
        for _ in 0..header.layers {
            let k = Array::from_slice(&floats[at..at + k_len], &header.key_shape);
            at += k_len;
            let v = Array::from_slice(&floats[at..at + v_len], &header.value_shape);
            at += v_len;
            layers.push((k.as_dtype(dtype).ok()?, v.as_dtype(dtype).ok()?));
        }
        Some(layers)
    }

    fn remove(&mut self, hash: u64) {
        if let Some((size, _)) = self.files.remove(&hash) {
            self.used -= size;
            let _ = std::fs::remove_file(self.path(hash));
        }
    }

    /// Deletes the least recently used files until the budget holds.
    fn evict(&mut self) {
        while self.used > self.budget {
            let Some((&oldest, _)) = self.files.iter().min_by_key(|(_, (_, when))| *when) else {
                break;
            };
            self.remove(oldest);
        }
    }
}

impl Drop for DiskTier {
    fn drop(&mut self) {
        // Pending writes finish before the engine is gone.
        drop(self.writes.take());
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}
