//! The model's tokenizer (`tokenizer.json`), its end-of-sequence ids, and incremental detokenization.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::config::token_ids;
use crate::error::{Error, Result};

/// A Hugging Face tokenizer with the ids that end a generation.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    eos: BTreeSet<u32>,
    dir: PathBuf,
}

impl Tokenizer {
    /// Loads `tokenizer.json` of `dir`. End-of-sequence ids are the union of
    /// `config.json`'s `eos_token_id` (passed in), `generation_config.json`'s
    /// `eos_token_id` (an id or a list) and `tokenizer_config.json`'s `eos_token`.
    pub fn load(dir: &Path, config_eos: &[u32]) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        let inner = tokenizers::Tokenizer::from_file(&path).map_err(|e| Error::Tokenizer {
            dir: dir.to_owned(),
            what: format!("cannot load {}: {e}", path.display()),
        })?;
        let mut eos: BTreeSet<u32> = config_eos.iter().copied().collect();
        if let Some(generation) = read_json(&dir.join("generation_config.json"))? {
            eos.extend(token_ids(generation.get("eos_token_id")));
        }
        if let Some(config) = read_json(&dir.join("tokenizer_config.json"))? {
            if let Some(id) =
                special_token(&config, "eos_token").and_then(|t| inner.token_to_id(&t))
            {
                eos.insert(id);
            }
        }
        Ok(Self {
            inner,
            eos,
            dir: dir.to_owned(),
        })
    }

    /// Encodes `text`; `special` adds the tokenizer's own special tokens
    /// (a BOS, say), as for a plain prompt. Rendered chat templates already
    /// hold theirs, so they are encoded without.
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode(text, special)
            .map_err(|e| self.error(e))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Encodes a (query, document) pair as a cross-encoder reads it, with
    /// the tokenizer's pair template: the ids and their token types.
    pub fn encode_pair(&self, first: &str, second: &str) -> Result<(Vec<u32>, Vec<u32>)> {
        let encoding = self
            .inner
            .encode((first, second), true)
            .map_err(|e| self.error(e))?;
        Ok((
            encoding.get_ids().to_vec(),
            encoding.get_type_ids().to_vec(),
        ))
    }

    /// How many ids the tokenizer knows, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Decodes `ids` to text, leaving out special tokens.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, true).map_err(|e| self.error(e))
    }

    /// Whether `id` ends a generation.
    pub fn is_eos(&self, id: u32) -> bool {
        self.eos.contains(&id)
    }

    /// The end-of-sequence ids.
    pub fn eos_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.eos.iter().copied()
    }

    /// The Hugging Face tokenizer itself (for the grammar engine's token table).
    pub(crate) fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// The folder it was loaded from.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The id of a token string, if it is one token.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    fn error(&self, e: impl std::fmt::Display) -> Error {
        Error::Tokenizer {
            dir: self.dir.clone(),
            what: e.to_string(),
        }
    }
}

/// Reads a JSON file that may be absent.
pub(crate) fn read_json(path: &Path) -> Result<Option<Value>> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|source| Error::Json {
                path: path.to_owned(),
                source,
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::Io {
            path: path.to_owned(),
            source,
        }),
    }
}

/// A special token of `tokenizer_config.json`: a string, or an AddedToken
/// object with `content`.
pub(crate) fn special_token(config: &Value, key: &str) -> Option<String> {
    match config.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

/// Turns generated ids into text piece by piece without ever emitting an
/// incomplete UTF-8 character.
///
/// Byte-level tokenizers split multi-byte characters across tokens, and
/// SentencePiece-style decoders drop or keep a leading space depending on
/// context, so tokens cannot be decoded one at a time. As Hugging Face's
/// text-generation-inference does, the decoder re-decodes a short window
/// that starts a few tokens back and emits what grew, but only once the
/// window no longer ends in U+FFFD (the mark of a character still missing
/// bytes).
#[derive(Debug, Default)]
pub struct StreamDecoder {
    ids: Vec<u32>,
    /// Start of the context window.
    prefix: usize,
    /// End of what was already emitted.
    read: usize,
}

impl StreamDecoder {
    /// An empty decoder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `id` and returns the text that became final (often empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String> {
        self.ids.push(id);
        let before = tokenizer.decode(&self.ids[self.prefix..self.read])?;
        let now = tokenizer.decode(&self.ids[self.prefix..])?;
        if now.len() > before.len() && !now.ends_with('\u{FFFD}') {
            self.prefix = self.read;
            self.read = self.ids.len();
            Ok(suffix_after(&now, &before).to_owned())
        } else {
            Ok(String::new())
        }
    }

    /// Returns whatever is still held back (an incomplete character comes
    /// out as U+FFFD) and empties the decoder.
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<String> {
        let before = tokenizer.decode(&self.ids[self.prefix..self.read])?;
        let now = tokenizer.decode(&self.ids[self.prefix..])?;
        *self = Self::default();
        Ok(suffix_after(&now, &before).to_owned())
    }
}

/// The part of `now` after `before`; when a decoder rewrote the start of the
/// window (rare), after their longest common prefix.
fn suffix_after<'a>(now: &'a str, before: &str) -> &'a str {
    if let Some(rest) = now.strip_prefix(before) {
        return rest;
    }
    let common = now
        .char_indices()
        .zip(before.chars())
        .take_while(|((_, a), b)| a == b)
        .last()
        .map_or(0, |((i, c), _)| i + c.len_utf8());
    &now[common..]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A byte-level BPE tokenizer whose vocabulary holds every single byte,
    /// so a multi-byte character can be fed one byte (token) at a time.
    fn byte_tokenizer() -> Tokenizer {
        let alphabet: Vec<String> = tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet()
            .into_iter()
            .map(|c| c.to_string())
            .collect();
        let vocab: serde_json::Map<String, Value> = alphabet
            .iter()
            .enumerate()
            .map(|(i, c)| (c.clone(), Value::from(i)))
            .collect();
        let json = serde_json::json!({
            "version": "1.0",
            "added_tokens": [{"id": 256, "content": "<eos>", "single_word": false, "lstrip": false,
                              "rstrip": false, "normalized": false, "special": true}],
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "vocab": vocab, "merges": []}
        });
        let inner = tokenizers::Tokenizer::from_bytes(json.to_string()).unwrap();
        Tokenizer {
            inner,
            eos: BTreeSet::from([256]),
            dir: PathBuf::from("test"),
        }
    }

    fn stream(tokenizer: &Tokenizer, ids: &[u32]) -> Vec<String> {
        let mut decoder = StreamDecoder::new();
        let mut out: Vec<String> = ids
            .iter()
            .map(|id| decoder.push(tokenizer, *id).unwrap())
            .collect();
        out.push(decoder.finish(tokenizer).unwrap());
        out
    }

    #[test]
    fn multi_byte_characters_wait_for_their_last_byte() {
        let t = byte_tokenizer();
        // "é" is two bytes, "😀" four: each byte is one token here.
        let ids = t.encode("aé😀b", false).unwrap();
        assert_eq!(ids.len(), 1 + 2 + 4 + 1);
        let pieces = stream(&t, &ids);
        assert_eq!(pieces, ["a", "", "é", "", "", "", "😀", "b", ""]);
        assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')));
    }

    #[test]
    fn an_unfinished_character_is_flushed_at_the_end() {
        let t = byte_tokenizer();
        let ids = t.encode("x😀", false).unwrap();
        let pieces = stream(&t, &ids[..3]);
        assert_eq!(pieces, ["x", "", "", "\u{FFFD}"]);
    }

    #[test]
    fn special_tokens_are_skipped() {
        let t = byte_tokenizer();
        let mut ids = t.encode("hi", false).unwrap();
        ids.push(256);
        assert_eq!(stream(&t, &ids).concat(), "hi");
        assert!(t.is_eos(256));
    }
}
