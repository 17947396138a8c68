//! The MTP proposer: the model's own multi-token-prediction layer (MiMo's
//! `model.mtp_layers.0`, see `model::mtp`) guesses the tokens the model
//! verifies, with no second model and no memory but one layer's cache.
//!
//! The layer reads the model's hidden state at each position with the
//! token after it, so it follows the sequence one position behind the
//! model, on a key/value cache of its own. Every pass of the model over a
//! sequence that proposes this way hands its hidden states here
//! ([`MtpState::push`]): prompt chunks, plain decoding steps (alone or in
//! a batch) and verifications (only the rows of the tokens the model
//! kept). They are fed to the layer once the token after each is known
//! ([`MtpState::catch_up`], lazily, within the engine's next step), so the
//! layer's cache holds exactly the accepted positions: rejected proposals
//! never reach it, and its own recursive guesses are forgotten after each
//! proposal. The last fed row's output is the first guess; each further
//! guess feeds the layer its own output and the guess before.
//!
//! Where the model's hidden states of some positions were never computed
//! by this request (a prefix restored from the prefix cache, or more
//! than [`MAX_PENDING`] positions decoded in company before a catch-up),
//! the layer's cache starts after them: its guesses read less context,
//! the answer is the model's all the same.

use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::argmax_axis;
use mlx_rs::{Array, Dtype};

use crate::cache::KvCache;
use crate::error::Result;
use crate::indexing::IndexOnStream;
use crate::model::Model;
use crate::session::ids;

/// Hidden states of at most this many positions wait for the tokens after
/// them; past it the oldest are dropped (and the layer's cache restarts
/// after them).
pub(crate) const MAX_PENDING: usize = 1024;

/// One sequence's MTP layer state.
#[derive(Default)]
pub(crate) struct MtpState {
    /// The layer's keys and values of the positions it was fed.
    cache: Option<KvCache>,
    /// The model's hidden states not fed yet: the position of each run's
    /// first row and its `(1, n, width)` rows, in order.
    pending: Vec<(usize, Array)>,
    /// The layer's output at the last position fed, `(1, 1, width)`: the
    /// first guess of the next proposal.
    last: Option<(usize, Array)>,
}

impl MtpState {
    /// Hands over the model's hidden states `(1, n, width)` of positions
    /// `start..start + n` of the sequence.
    pub(crate) fn push(&mut self, start: usize, hidden: Array) {
        self.pending.push((start, hidden));
        let mut rows: usize = self.pending.iter().map(|(_, h)| h.dim(1) as usize).sum();
        while rows > MAX_PENDING && self.pending.len() > 1 {
            rows -= self.pending.remove(0).1.dim(1) as usize;
        }
    }

    /// Where the layer's fed positions end (the next position it takes).
    fn end(&self) -> Option<usize> {
        self.cache.as_ref().map(|c| c.position() as usize)
    }

    /// Feeds the layer the pending rows whose next token `token(p + 1)`
    /// is known, `len` tokens being known; returns the arrays to evaluate
    /// (the layer's cache and last output), empty when nothing was fed.
    /// Lazy.
    pub(crate) fn catch_up(
        &mut self,
        model: &Model,
        len: usize,
        token: impl Fn(usize) -> u32,
    ) -> Result<Vec<Array>> {
        // The latest contiguous run of pending rows, from where the layer
        // stands or (after a gap) from its own start.
        let mut runs: Vec<(usize, Array)> = Vec::new();
        let mut kept = Vec::new();
        for (start, hidden) in std::mem::take(&mut self.pending) {
            let n = hidden.dim(1) as usize;
            let known = len.saturating_sub(start + 1).min(n);
            if known < n {
                // Rows whose next token is not known yet stay pending.
                kept.push((start + known, hidden.at((.., known as i32.., ..))?));
            }
            if known == 0 {
                continue;
            }
            let rows = if known == n {
                hidden
            } else {
                hidden.at((.., ..known as i32, ..))?
            };
            let contiguous = runs
                .last()
                .is_some_and(|(s, h)| s + h.dim(1) as usize == start);
            if contiguous {
                let (s, h) = runs.pop().expect("a run");
                runs.push((s, concatenate(&[h, rows], 1)?));
            } else {
                runs.push((start, rows));
            }
        }
        self.pending = kept;
        let Some((start, hidden)) = runs.pop() else {
            return Ok(Vec::new());
        };
        let end = self.end();
        let cache = match (self.cache.as_mut(), end) {
            // Positions the layer holds from an earlier pass are replaced.
            (Some(cache), Some(end)) if start <= end && start >= cache.start() as usize => {
                cache.truncate((start - cache.start() as usize) as i32);
                cache
            }
            _ => self.cache.insert(KvCache::starting_at(start as i32)),
        };
        let n = hidden.dim(1) as usize;
        let next: Vec<u32> = (start + 1..start + 1 + n).map(&token).collect();
        let out = model.mtp_forward(&hidden, &ids(&next)?, cache)?;
        let last = out.at((.., -1.., ..))?;
        self.last = Some((start + n - 1, last.clone()));
        let mut arrays: Vec<Array> = cache.state().cloned().collect();
        arrays.push(last);
        Ok(arrays)
    }

    /// Up to `k` (at least 1) guesses of the tokens after `context` (the
    /// sequence's tokens so far), read with one wait; none where the layer
    /// has not seen the model's hidden state of the last position but one
    /// (the model has not computed it in this request).
    pub(crate) fn propose(&mut self, model: &Model, context: &[u32], k: usize) -> Result<Vec<u32>> {
        let n = context.len();
        self.catch_up(model, n, |p| context[p])?;
        let (Some((at, last)), Some(cache)) = (self.last.clone(), self.cache.as_mut()) else {
            return Ok(Vec::new());
        };
        if at + 2 != n || cache.position() as usize != n - 1 {
            return Ok(Vec::new());
        }
        let fed = cache.offset();
        let mut out = last;
        let mut chosen: Vec<Array> = Vec::with_capacity(k);
        for step in 0..k.max(1) {
            let logits = model.mtp_logits(&out)?;
            let token =
                argmax_axis(&logits.at((.., -1, ..))?, -1, None)?.as_dtype(Dtype::Uint32)?;
            if step + 1 < k {
                out = model.mtp_forward(&out, &token.reshape(&[1, 1])?, cache)?;
            }
            chosen.push(token);
        }
        let all = concatenate(&chosen, 0)?;
        all.eval()?;
        // The layer forgets its own guesses: the model's hidden states of
        // the kept ones take their place.
        cache.truncate(fed);
        Ok(all.as_slice::<u32>().to_vec())
    }
}

impl Model {
    /// The MTP layer's `k` greedy guesses of the tokens after `context`
    /// (at least two tokens), as a sequence that decoded `context` would
    /// get them from the proposer: the model's hidden states of every
    /// position but the last (computed over the whole context) fed to the
    /// layer, then the layer applied recursively. Empty for a model without MTP layers. For checking
    /// the proposer against a reference.
    pub fn mtp_guesses(&self, context: &[u32], k: usize) -> Result<Vec<u32>> {
        if self.mtp_layers() == 0 || context.len() < 2 {
            return Ok(Vec::new());
        }
        let n = context.len() as i32;
        let hidden = self.hidden(&ids(context)?, &mut self.new_cache())?;
        let mut state = MtpState::default();
        state.push(0, hidden.at((.., ..n - 1, ..))?);
        state.propose(self, context, k)
    }
}
