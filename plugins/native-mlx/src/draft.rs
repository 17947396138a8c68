//! A draft model: a small model of the target's tokenizer that proposes
//! the tokens the target verifies (speculative decoding), or the target's
//! own first layers (self-speculation).
//!
//! The drafter decodes greedily on a cache of its own per sequence, a few
//! tokens ahead of the target: its `k` steps are built as one lazy chain
//! (each step fed the still lazy argmax of the one before) and read with
//! one wait. Its proposals are certain (all mass on one token), which is
//! what the verification in `speculate` takes, so greedy answers stay the
//! target's own and sampled ones keep the target's distribution whatever
//! the drafter says: a poor drafter costs time, never correctness.
//!
//! A drafter fits when its tokenizer maps every token to the same id as
//! the target's; one that does not (another family, another vocabulary),
//! or whose folder this engine cannot load, is not used, and the reason
//! says why, so that the model serves with plain decoding.

use std::path::{Path, PathBuf};

use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::argmax_axis;
use mlx_rs::transforms::eval;
use mlx_rs::{with_stream, Array, Dtype};

use crate::cache::KvCache;
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::indexing::IndexOnStream;
use crate::model::{LoadOptions, Model};
use crate::session::ids;
use crate::tokenizer::Tokenizer;
use crate::turn::mlx_turn;
use crate::Session;

/// Prompt tokens the drafter takes in one forward pass when it catches up.
const CATCH_UP: usize = 2048;

/// A loaded draft model, for the sequences of one target.
pub struct Drafter {
    model: Model,
    dir: PathBuf,
    /// Rows of the target's embedding: a proposal at or past it cannot be
    /// fed to the target.
    target_vocab: u32,
}

/// What became of a `draft_model` setting.
pub enum DraftLoad {
    /// The drafter, ready.
    Fits(Box<Drafter>),
    /// Not used, and why: the model serves with plain decoding.
    Unfit(String),
}

impl Drafter {
    /// How much each prompt token matters to the prompt's last `last`
    /// tokens, by the drafter's attention (SpecPrefill's scores; see
    /// [`Model::importance`]).
    pub fn importance(&self, prompt: &[u32], last: usize) -> Result<Vec<f32>> {
        self.model.importance(prompt, last, CATCH_UP)
    }

    /// Loads the model folder `dir` as a drafter for `target`, on the
    /// target's stream. A folder that is not there is an error (a wrong
    /// setting); one that does not fit the target is [`DraftLoad::Unfit`].
    pub fn load(dir: &Path, target: &Session) -> Result<DraftLoad> {
        if !dir.join("config.json").is_file() {
            return Err(Error::InvalidConfig {
                path: dir.to_owned(),
                what: "the draft model's folder has no config.json (setting 'draft_model' must name an MLX model folder)".into(),
            });
        }
        let config = match ModelConfig::load(dir) {
            Ok(config) => config,
            Err(e) => return Ok(DraftLoad::Unfit(format!("this engine cannot load it: {e}"))),
        };
        let tokenizer = match Tokenizer::load(dir, &config.eos_token_ids) {
            Ok(tokenizer) => tokenizer,
            Err(e) => return Ok(DraftLoad::Unfit(e.to_string())),
        };
        if let Some(why) = tokenizer_mismatch(&target.tokenizer, &tokenizer) {
            return Ok(DraftLoad::Unfit(why));
        }
        let target_vocab = target.model.config().vocab_size as u32;
        let model = {
            let _turn = mlx_turn();
            with_stream(&target.stream.0, || {
                Model::load(dir, config, &LoadOptions::default())
            })?
        };
        Ok(DraftLoad::Fits(Box::new(Self {
            model,
            dir: dir.to_owned(),
            target_vocab,
        })))
    }

    /// The target's own first `layers` blocks, its final norm and output
    /// projection as the drafter (self-speculation: no other model, no
    /// memory but the drafter's cache). `layers` must leave the target
    /// some of its own: from 1 to its layer count less one.
    pub fn first_layers(target: &Session, layers: usize) -> Result<Drafter> {
        let all = target.model.config().num_layers;
        if layers == 0 || layers >= all {
            return Err(Error::InvalidRequest(format!(
                "setting 'draft_layers' must be from 1 to {} (the model has {all} layers), got {layers}",
                all.saturating_sub(1)
            )));
        }
        Ok(Self {
            model: target.model.first_layers(layers),
            dir: target.dir.clone(),
            target_vocab: target.model.config().vocab_size as u32,
        })
    }

    /// The folder it was loaded from (the target's own, for a drafter of
    /// its first layers).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Up to `k` (at least 1) greedy tokens to follow `context`, the
    /// sequence's tokens so far; `state` is the sequence's drafter cache,
    /// which holds a prefix of `context` and takes the rest first. Lazy
    /// until the one read at the end. Stops early at a token the target
    /// could not take.
    pub(crate) fn propose(
        &self,
        state: &mut DraftState,
        context: &[u32],
        k: usize,
    ) -> Result<Vec<u32>> {
        let state_cache = state.cache.get_or_insert_with(|| self.model.new_cache());
        // A token past the drafter's embedding (a target that samples its
        // padding rows) is read as the last row: it only makes the
        // drafter's guess worse, which the verification catches.
        let rows = self.model.config().vocab_size as u32;
        let fresh: Vec<u32> = context[state.fed..]
            .iter()
            .map(|&t| t.min(rows - 1))
            .collect();
        let (body, last) = fresh.split_at(fresh.len() - 1);
        for chunk in body.chunks(CATCH_UP) {
            self.model.hidden(&ids(chunk)?, state_cache)?;
            eval(state_cache.iter().flat_map(KvCache::state))?;
        }
        let mut input = ids(last)?;
        let mut chosen: Vec<Array> = Vec::with_capacity(k);
        for step in 0..k.max(1) {
            let logits = self.model.logits(&input, state_cache)?;
            let token =
                argmax_axis(&logits.at((.., -1, ..))?, -1, None)?.as_dtype(Dtype::Uint32)?;
            if step + 1 < k {
                input = token.reshape(&[1, 1])?;
            }
            chosen.push(token);
        }
        let all = concatenate(&chosen, 0)?;
        all.eval()?;
        // The cache now holds `context` and every proposal but the last.
        state.fed = context.len() + chosen.len() - 1;
        let mut proposal: Vec<u32> = all.as_slice::<u32>().to_vec();
        if let Some(bad) = proposal.iter().position(|&t| t >= self.target_vocab) {
            proposal.truncate(bad);
        }
        Ok(proposal)
    }
}

/// One sequence's drafter cache: the keys and values of its first `fed`
/// tokens.
#[derive(Default)]
pub(crate) struct DraftState {
    cache: Option<Vec<KvCache>>,
    fed: usize,
}

impl DraftState {
    /// Keeps the first `len` tokens (the target kept the proposals up to
    /// there), forgetting the rest.
    pub(crate) fn keep(&mut self, len: usize) {
        if len < self.fed {
            self.fed = len;
            for layer in self.cache.iter_mut().flatten() {
                layer.truncate(len as i32);
            }
        }
    }
}

/// Why `draft`'s tokenizer does not fit `target`'s, if it does not: the
/// two must give every token the same id.
fn tokenizer_mismatch(target: &Tokenizer, draft: &Tokenizer) -> Option<String> {
    let (t, d) = (
        target.inner().get_vocab(true),
        draft.inner().get_vocab(true),
    );
    if t.len() != d.len() {
        return Some(format!(
            "its tokenizer has {} tokens and the model's {}",
            d.len(),
            t.len()
        ));
    }
    let differ = t
        .iter()
        .filter(|(token, id)| d.get(*token) != Some(id))
        .count();
    (differ > 0).then(|| {
        format!(
            "its tokenizer gives {differ} of the model's {} tokens other ids",
            t.len()
        )
    })
}
