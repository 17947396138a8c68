//! What a benchmarked model is on disk: each file's name and size, the
//! SHA-256 of its config and tokenizer files, and of the headers of its
//! weights (safetensors' JSON header, GGUF's metadata and tensor table),
//! so that two runs or two engines can tell whether they read the same
//! model without hashing gigabytes of weights.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The largest whole file hashed (configs, tokenizers, templates).
const MAX_HASHED_FILE: u64 = 64 * 1024 * 1024;
/// The largest weights header hashed; a larger one is reported unhashed.
const MAX_HEADER: u64 = 256 * 1024 * 1024;

/// One file of a model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FileFingerprint {
    /// The name inside the model folder (or the model file's own name).
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// What was hashed: `file`, `header`, or `none` (weights of an unknown
    /// kind, or a header too large).
    pub hashed: String,
    /// The SHA-256 of what was hashed, hex.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub sha256: Option<String>,
}

/// Fingerprints of `names` under `path` (a folder, or the model file itself
/// when `names` is its own name).
pub(crate) fn fingerprint(path: &Path, names: &[String]) -> Result<Vec<FileFingerprint>, String> {
    let mut out = Vec::new();
    for name in names {
        let file = if path.is_dir() {
            path.join(name)
        } else {
            path.to_path_buf()
        };
        out.push(fingerprint_file(&file, name).map_err(|e| {
            format!(
                "cannot fingerprint model file {}: {e}; check that the model is complete and readable",
                file.display()
            )
        })?);
    }
    Ok(out)
}

fn fingerprint_file(file: &Path, name: &str) -> std::io::Result<FileFingerprint> {
    let mut handle = File::open(file)?;
    let meta = handle.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let size = meta.len();
    let lower = name.to_ascii_lowercase();
    let header_len = if lower.ends_with(".safetensors") {
        Some(safetensors_header_len(&mut handle, size)?)
    } else if lower.ends_with(".gguf") {
        Some(gguf_header_len(&mut handle, size)?)
    } else {
        None
    };
    let (hashed, len) = match header_len {
        Some(len) if len <= MAX_HEADER => ("header", Some(len)),
        Some(_) => ("none", None),
        None if size <= MAX_HASHED_FILE => ("file", Some(size)),
        None => ("none", None),
    };
    let sha256 = match len {
        Some(len) => {
            handle.seek(SeekFrom::Start(0))?;
            let mut hasher = Sha256::new();
            std::io::copy(&mut (&mut handle).take(len), &mut hasher)?;
            Some(hex(&hasher.finalize()))
        }
        None => None,
    };
    Ok(FileFingerprint {
        name: name.to_string(),
        size,
        hashed: hashed.into(),
        sha256,
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn invalid(what: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what)
}

/// The length of a safetensors file's header: the 8-byte length prefix and
/// the JSON it announces.
fn safetensors_header_len(r: &mut impl Read, size: u64) -> std::io::Result<u64> {
    let n = read_u64(r)?;
    if n > size.saturating_sub(8) {
        return Err(invalid(format!(
            "declares a {n}-byte safetensors header in a {size}-byte file"
        )));
    }
    Ok(8 + n)
}

/// The length of a GGUF file's header: magic, version, counts, every
/// metadata key-value and every tensor description, up to the (aligned)
/// tensor data.
fn gguf_header_len(r: &mut impl Read, size: u64) -> std::io::Result<u64> {
    let mut r = Counting {
        inner: r,
        read: 0,
        limit: size.min(MAX_HEADER),
    };
    let mut magic = [0u8; 4];
    r.read_exact(&mut magic)?;
    if &magic != b"GGUF" {
        return Err(invalid("does not start with GGUF's magic".into()));
    }
    let version = read_u32(&mut r)?;
    if !(2..=3).contains(&version) {
        return Err(invalid(format!(
            "is GGUF version {version}; versions 2 and 3 are read"
        )));
    }
    let tensors = read_u64(&mut r)?;
    let kvs = read_u64(&mut r)?;
    for _ in 0..kvs {
        skip_string(&mut r)?;
        let kind = read_u32(&mut r)?;
        skip_value(&mut r, kind, 0)?;
    }
    for _ in 0..tensors {
        skip_string(&mut r)?;
        let dims = read_u32(&mut r)?;
        skip(&mut r, u64::from(dims) * 8 + 4 + 8)?;
    }
    Ok(r.read)
}

/// A reader that counts what it read and refuses to go past `limit`.
struct Counting<'a, R> {
    inner: &'a mut R,
    read: u64,
    limit: u64,
}

impl<R: Read> Read for Counting<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let room = self.limit.saturating_sub(self.read);
        if room == 0 && !buf.is_empty() {
            return Err(invalid(
                "GGUF header runs past the end of the file (or 256 MiB)".into(),
            ));
        }
        let take = buf.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..take])?;
        self.read += n as u64;
        Ok(n)
    }
}

fn read_u32(r: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_u64(r: &mut impl Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn skip(r: &mut impl Read, n: u64) -> std::io::Result<()> {
    let copied = std::io::copy(&mut r.take(n), &mut std::io::sink())?;
    if copied == n {
        Ok(())
    } else {
        Err(std::io::ErrorKind::UnexpectedEof.into())
    }
}

fn skip_string(r: &mut impl Read) -> std::io::Result<()> {
    let n = read_u64(r)?;
    skip(r, n)
}

/// Skips one GGUF metadata value of type `kind`.
fn skip_value(r: &mut impl Read, kind: u32, depth: u32) -> std::io::Result<()> {
    // uint8, int8, uint16, int16, uint32, int32, float32, bool, string,
    // array, uint64, int64, float64.
    let fixed = match kind {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        8 => return skip_string(r),
        9 if depth < 4 => {
            let item = read_u32(r)?;
            let count = read_u64(r)?;
            return match item {
                8 | 9 => (0..count).try_for_each(|_| skip_value(r, item, depth + 1)),
                _ => {
                    let width = match item {
                        0 | 1 | 7 => 1,
                        2 | 3 => 2,
                        4..=6 => 4,
                        10..=12 => 8,
                        other => {
                            return Err(invalid(format!("has unknown GGUF value type {other}")))
                        }
                    };
                    skip(r, count.saturating_mul(width))
                }
            };
        }
        other => return Err(invalid(format!("has unknown GGUF value type {other}"))),
    };
    skip(r, fixed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{expect, Expect};

    fn gguf_string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }

    /// A GGUF v3 file: two metadata values (a string, an array of u32) and
    /// one 2-D tensor, then `data` as the tensor data.
    fn tiny_gguf(data: &[u8]) -> (Vec<u8>, usize) {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(1u64.to_le_bytes()); // tensors
        b.extend(2u64.to_le_bytes()); // key-values
        gguf_string(&mut b, "general.name");
        b.extend(8u32.to_le_bytes());
        gguf_string(&mut b, "tiny");
        gguf_string(&mut b, "list");
        b.extend(9u32.to_le_bytes());
        b.extend(4u32.to_le_bytes());
        b.extend(3u64.to_le_bytes());
        b.extend([1u8; 12]);
        gguf_string(&mut b, "w");
        b.extend(2u32.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        b.extend(0u32.to_le_bytes()); // f32
        b.extend(0u64.to_le_bytes()); // offset
        let header = b.len();
        b.extend(data);
        (b, header)
    }

    fn check(name: &str, bytes: &[u8], expected: Expect) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(name), bytes).unwrap();
        let actual = match fingerprint(dir.path(), &[name.to_string()]) {
            Ok(f) => format!(
                "{} {} {} {}",
                f[0].name,
                f[0].size,
                f[0].hashed,
                f[0].sha256.as_deref().map_or("-", |s| &s[..12])
            ),
            Err(e) => e.replace(&dir.path().display().to_string(), "DIR"),
        };
        expected.assert_eq(&actual);
    }

    #[test]
    fn fingerprints() {
        check(
            "config.json",
            b"{}",
            expect!["config.json 2 file 44136fa355b3"],
        );
        let mut st = 2u64.to_le_bytes().to_vec();
        st.extend(b"{}");
        let header_only = st.clone();
        st.extend([7u8; 32]);
        // The header's hash: the same as a file that is only that header.
        check(
            "model.safetensors",
            &st,
            expect!["model.safetensors 42 header 411a485216e4"],
        );
        check(
            "model.safetensors",
            &header_only,
            expect!["model.safetensors 10 header 411a485216e4"],
        );
        check(
            "model.safetensors",
            &99u64.to_le_bytes(),
            expect!["cannot fingerprint model file DIR/model.safetensors: declares a 99-byte safetensors header in a 8-byte file; check that the model is complete and readable"],
        );
        let (g, header) = tiny_gguf(&[0u8; 16]);
        let (g2, _) = tiny_gguf(&[9u8; 16]);
        check("m.gguf", &g, expect!["m.gguf 157 header a0a6bdc3cfca"]);
        // Other tensor data, the same header: the same hash.
        check("m.gguf", &g2, expect!["m.gguf 157 header a0a6bdc3cfca"]);
        check(
            "m.gguf",
            &g[..header],
            expect!["m.gguf 141 header a0a6bdc3cfca"],
        );
        check(
            "m.gguf",
            &g[..header - 3],
            expect!["cannot fingerprint model file DIR/m.gguf: GGUF header runs past the end of the file (or 256 MiB); check that the model is complete and readable"],
        );
        check(
            "m.gguf",
            b"GGML....",
            expect!["cannot fingerprint model file DIR/m.gguf: does not start with GGUF's magic; check that the model is complete and readable"],
        );
    }
}
