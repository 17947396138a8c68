//! The safetensors tensors of a model folder, taken out one by one while the model is built.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mlx_rs::{Array, Dtype};

use crate::error::{Error, Result};

/// All tensors of a checkpoint, by name.
pub(crate) struct Weights {
    dir: PathBuf,
    tensors: HashMap<String, Array>,
}

impl Weights {
    /// Loads every `model*.safetensors` file of `dir` (one file or the shards
    /// an index lists; mlx-lm takes the same files).
    pub(crate) fn load(dir: &Path) -> Result<Self> {
        let error = |what: String| Error::Weights {
            dir: dir.to_owned(),
            what,
        };
        let entries = std::fs::read_dir(dir).map_err(|source| Error::Io {
            path: dir.to_owned(),
            source,
        })?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|path| {
                path.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("model") && n.ends_with(".safetensors"))
            })
            .collect();
        if files.is_empty() {
            return Err(error("no model*.safetensors file".into()));
        }
        files.sort();
        let mut tensors = HashMap::new();
        for file in &files {
            // Lazy: each tensor is read when the model evaluates it, on the
            // caller's stream. On a GPU that reads straight into device
            // memory, as mlx-lm's `mx.load` does; read on a CPU stream they
            // would land in CUDA managed memory filled by the host, which
            // adds the whole model to the process's resident memory.
            let loaded = Array::load_safetensors(file)
                .map_err(|e| error(format!("cannot load {}: {e}", file.display())))?;
            tensors.extend(loaded);
        }
        for (name, tensor) in &tensors {
            let supported = matches!(
                tensor.dtype(),
                Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16 | Dtype::Uint32 | Dtype::Uint8
            );
            if !supported {
                return Err(error(format!(
                    "tensor '{name}' has dtype {:?}; native-mlx reads float32, float16, \
                     bfloat16 and MLX-quantized (uint32, with uint8 MXFP4 scales) weights",
                    tensor.dtype()
                )));
            }
        }
        Ok(Self {
            dir: dir.to_owned(),
            tensors,
        })
    }

    /// Removes and returns the tensor `name`.
    pub(crate) fn take(&mut self, name: &str) -> Result<Array> {
        self.tensors.remove(name).ok_or_else(|| Error::Weights {
            dir: self.dir.clone(),
            what: format!("tensor '{name}' is missing"),
        })
    }

    /// Whether a tensor `name` exists (and was not taken yet).
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Checks that every tensor was used: a leftover means the config and
    /// the checkpoint disagree (a bias the config does not declare, a
    /// different architecture), and computing without it would be wrong.
    pub(crate) fn finish(mut self, unused_ok: impl Fn(&str) -> bool) -> Result<()> {
        self.tensors.retain(|name, _| !unused_ok(name));
        if self.tensors.is_empty() {
            return Ok(());
        }
        let mut names: Vec<&str> = self.tensors.keys().map(String::as_str).collect();
        names.sort_unstable();
        let shown = names.iter().take(5).copied().collect::<Vec<_>>().join(", ");
        Err(Error::Weights {
            dir: self.dir,
            what: format!(
                "{} tensors do not belong to the model config.json describes (e.g. {shown})",
                names.len()
            ),
        })
    }

    /// The model folder, for messages.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }
}
