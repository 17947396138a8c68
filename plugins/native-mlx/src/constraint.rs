//! Constrained decoding: a request's grammar as a mask over each step's tokens.
//!
//! The host writes what a request must produce (`response_format`'s JSON
//! schema, a forced tool call in the model's markup) as one grammar in
//! llguidance's Lark syntax, JSON schemas inside as `%json { … }`. Here
//! llguidance's [`Matcher`] follows the request token by token and says,
//! before each draw, which tokens may come next; the batcher sets every
//! other token's logit to -inf, so greedy and seeded draws alike only
//! ever pick a token the grammar allows. The grammar ends the request
//! where it is complete (or lets it stop with an end-of-sequence token
//! where it may end).
//!
//! The token trie is built once per model, at its first constrained
//! request (tens of milliseconds for a 150k vocabulary), from the bytes
//! of each token of the loaded `tokenizer.json`; llguidance's own
//! `toktrie_hf_tokenizers` would bring a second, older `tokenizers`.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use mlx_rs::ops::indexing::take_axis;
use mlx_rs::Array;

use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;

/// The grammar compiler of one model, built at first use.
#[derive(Default)]
pub(crate) struct Grammars {
    factory: Option<Arc<ParserFactory>>,
}

impl Grammars {
    /// A matcher for `lark` (llguidance's Lark syntax), at the start of
    /// the answer; a grammar that does not compile is the request's fault.
    pub(crate) fn compile(&mut self, tokenizer: &Tokenizer, lark: &str) -> Result<Constraint> {
        let factory = match &self.factory {
            Some(factory) => factory.clone(),
            None => {
                let factory = Arc::new(factory(tokenizer)?);
                self.factory = Some(factory.clone());
                factory
            }
        };
        let grammar = TopLevelGrammar::from_lark(lark.to_string());
        let parser = factory
            .create_parser(grammar)
            .map_err(|e| Error::InvalidRequest(format!("the request's grammar: {e}")))?;
        Ok(Constraint {
            matcher: Matcher::new(Ok(parser)),
        })
    }
}

fn factory(tokenizer: &Tokenizer) -> Result<ParserFactory> {
    let broken = |e: String| Error::Tokenizer {
        dir: tokenizer.dir().to_owned(),
        what: format!("cannot build the grammar engine's token table: {e}"),
    };
    let json: serde_json::Value = serde_json::from_str(
        &tokenizer
            .inner()
            .to_string(false)
            .map_err(|e| broken(e.to_string()))?,
    )
    .map_err(|e| broken(e.to_string()))?;
    let tokens =
        llguidance::token_bytes_from_tokenizer_json(&json).map_err(|e| broken(e.to_string()))?;
    let eos: Vec<TokenId> = tokenizer.eos_ids().collect();
    let first = eos.first().copied().unwrap_or(u32::MAX);
    let info = TokRxInfo::new(tokens.len() as u32, first);
    let mut trie = TokTrie::from(&info, &tokens);
    if eos.len() > 1 {
        trie = trie.with_eos_tokens(&eos);
    }
    let env: TokEnv = Arc::new(Env {
        trie,
        tokenizer: tokenizer.inner().clone(),
    });
    let mut factory = ParserFactory::new_simple(&env).map_err(|e| broken(e.to_string()))?;
    // Grammar warnings go nowhere: a request's mistakes are its errors.
    factory.quiet();
    Ok(factory)
}

/// llguidance's view of the tokenizer: the trie, and how text tokenizes
/// (for the grammar's literal strings).
struct Env {
    trie: TokTrie,
    tokenizer: tokenizers::Tokenizer,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.tokenizer
            .encode(String::from_utf8_lossy(s).as_ref(), false)
            .map(|e| e.get_ids().to_vec())
            .unwrap_or_default()
    }
}

/// One request's grammar, where its answer stands.
pub(crate) struct Constraint {
    matcher: Matcher,
}

impl Constraint {
    /// Appends the tokens that may come next to `words`, as `n` bit words
    /// (token `i` is bit `i % 32` of word `i / 32`, llguidance's own
    /// layout, so nothing is converted on the host); ids the tokenizer does
    /// not have are never allowed.
    pub(crate) fn allowed_words(&mut self, n: usize, words: &mut Vec<u32>) -> Result<()> {
        let vob = self.matcher.compute_mask().map_err(grammar_error)?;
        if vob.is_zero() {
            return Err(Error::InvalidRequest(
                "the request's grammar allows no token here: it cannot be completed".into(),
            ));
        }
        let bits = vob.as_slice();
        let taken = bits.len().min(n);
        words.extend_from_slice(&bits[..taken]);
        words.resize(words.len() + n - taken, 0);
        Ok(())
    }

    /// Takes token `id` of the answer; `true` once the grammar is
    /// complete and allows nothing more.
    pub(crate) fn take(&mut self, id: u32) -> Result<bool> {
        self.matcher.consume_token(id).map_err(grammar_error)?;
        Ok(self.matcher.is_stopped())
    }
}

/// Masks as bit words, expanded on the device: the 32-fold smaller upload
/// of [`Constraint::allowed_words`], and no per-token loop on the host.
pub(crate) struct Unpack {
    width: usize,
    /// Per token id of the logits: the word that holds it, and its bit's value.
    word: Array,
    bit: Array,
}

impl Unpack {
    /// For logits `width` wide.
    pub(crate) fn new(width: usize) -> Self {
        let word: Vec<i32> = (0..width as i32).map(|i| i / 32).collect();
        let bit: Vec<u32> = (0..width as u32).map(|i| 1 << (i % 32)).collect();
        Self {
            width,
            word: Array::from_slice(&word, &[width as i32]),
            bit: Array::from_slice(&bit, &[width as i32]),
        }
    }

    pub(crate) fn width(&self) -> usize {
        self.width
    }

    /// Words per mask.
    pub(crate) fn words(&self) -> usize {
        self.width.div_ceil(32)
    }

    /// The `(rows, width)` boolean masks of `words` (`rows` masks of
    /// [`Unpack::words`] words each).
    pub(crate) fn masks(&self, words: &[u32], rows: usize) -> Result<Array> {
        let words = Array::from_slice(words, &[rows as i32, self.words() as i32]);
        let two = Array::from_slice(&[2u32], &[1]);
        let one = Array::from_slice(&[1u32], &[1]);
        Ok(take_axis(&words, &self.word, 1)?
            .floor_divide(&self.bit)?
            .remainder(&two)?
            .eq(&one)?)
    }
}

fn grammar_error(e: impl std::fmt::Display) -> Error {
    Error::EngineStopped(format!("the grammar engine failed: {e}"))
}
