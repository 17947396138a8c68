//! Speculative decoding: several tokens per pass over the weights.
//!
//! A decoding step of one sequence reads every weight to compute one
//! token, so a lone stream's speed is capped by memory bandwidth. Feeding
//! the step `k` proposed tokens after the last one costs about the same
//! read and gives the target's distribution at each of the `k + 1`
//! positions; the proposals the target agrees with are kept, the cache
//! forgets the rest, and one more token (the target's own choice after
//! the last kept proposal) comes free. Greedy output is the one plain
//! decoding gives; a sampled one keeps the target's distribution by
//! rejection sampling (Leviathan et al., 2023), here with a proposer that
//! puts all its mass on one token: a proposal `d` is kept with the
//! target's probability `p(d)`, and on a rejection the token is drawn from
//! `p` without `d`.
//!
//! The proposers: prompt lookup (the tokens that followed the latest
//! earlier occurrence of the last few tokens, in the prompt or the answer
//! so far), a predicted output (OpenAI's `prediction`: text the answer is
//! expected to resemble, followed where the answer so far matches it),
//! both without extra weights, a draft model (`draft`: a small model of
//! the same tokenizer, decoding greedily a few tokens ahead), and the
//! model's own multi-token-prediction layer where its checkpoint has one
//! (`mtp`: MiMo's, applied recursively).
//!
//! Speculation pays where the step is memory-bound: a sequence decoding
//! alone. The batcher speculates only then; with company, the batch
//! already shares each weight read among its rows.

use crate::draft::{DraftState, Drafter};
use crate::error::Result;
use crate::model::Model;
use crate::mtp::MtpState;

/// How a request proposes tokens to verify. The default proposes nothing.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Speculation {
    /// Propose from n-gram matches in the prompt and the answer so far.
    pub prompt_lookup: bool,
    /// Token ids the answer is expected to resemble (a predicted output).
    pub prediction: Option<Vec<u32>>,
    /// Propose with the engine's draft model (where it has one that fits;
    /// see [`crate::Drafter`]).
    pub draft_model: bool,
    /// Propose with the model's own multi-token-prediction layer (where
    /// its checkpoint has one; see [`crate::Model::mtp_layers`]).
    pub mtp: bool,
    /// Most tokens proposed per verification; 0 chooses (and adapts to the
    /// acceptance rate) up to [`MAX_K`].
    pub k: usize,
    /// For benchmarks only: every proposal is taken as if the model had
    /// chosen it (the verifying passes cost what they cost at acceptance
    /// 1.0, but the answer is the proposals', not the model's).
    #[doc(hidden)]
    pub accept_all: bool,
}

impl Speculation {
    /// Whether anything proposes.
    pub fn is_on(&self) -> bool {
        self.prompt_lookup
            || self.draft_model
            || self.mtp
            || self.prediction.as_ref().is_some_and(|p| !p.is_empty())
    }
}

/// The most tokens one verification takes, and what `k = 0` adapts within.
pub const MAX_K: usize = 8;

/// The longest n-gram prompt lookup matches; shorter ones are tried after.
const MAX_NGRAM: usize = 3;

/// The shortest match prompt lookup proposes after. After a match of one
/// token the proposals are seldom kept (SmolLM2-135M on the bench's edit
/// and copy prompts, k 4: 0.38 and 0.13 tokens kept a pass after one-token
/// matches, against 1.2 and 0.7 after two and 1.8 and 2.5 after three),
/// and a pass that keeps nothing costs more than the plain step it
/// replaces.
const MIN_LOOKUP_NGRAM: usize = 2;

/// Plain tokens a proposer rests for when no pass is expected to pay, at
/// first and at most (doubled each time in a row); after a rest it
/// proposes once by its acceptance rate alone, which keeps the rate fresh.
const REST: usize = 16;
const MAX_REST: usize = 512;

/// What decoding costs on this engine, for choosing how many tokens to
/// propose: a plain step of one sequence, and a verifying pass of each
/// number of rows (seconds, exponential averages, as the batcher measures
/// them). Speed is the hardware's and the model's, so it is learnt across
/// requests; how often proposals are kept is each request's.
#[derive(Debug, Clone, Default)]
pub(crate) struct Costs {
    pub plain: Option<f64>,
    verify: [Option<f64>; MAX_K + 2],
}

impl Costs {
    /// Counts a verifying pass of `rows` rows that took `seconds`.
    pub(crate) fn verified(&mut self, rows: usize, seconds: f64) {
        if let Some(slot) = self.verify.get_mut(rows) {
            *slot = Some(slot.map_or(seconds, |t| 0.8 * t + 0.2 * seconds));
        }
    }

    /// Whether a verifying pass of any size has been timed.
    fn measured(&self) -> bool {
        self.verify.iter().any(Option::is_some)
    }

    /// What a pass of `rows` rows is expected to take: as measured, else
    /// on the line from a plain step (one row) through the measured size
    /// nearest to it; a plain step while nothing is measured.
    fn pass(&self, rows: usize, plain: f64) -> f64 {
        if let Some(t) = self.verify.get(rows).copied().flatten() {
            return t;
        }
        let nearest = (2..self.verify.len())
            .filter_map(|r| Some((r, self.verify[r]?)))
            .min_by_key(|&(r, _)| r.abs_diff(rows));
        match nearest {
            Some((r, t)) => plain + (t - plain) * (rows - 1) as f64 / (r - 1) as f64,
            None => plain,
        }
    }
}

/// Speculation's counts for one request.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SpecUsage {
    /// Verifying passes.
    pub verifications: usize,
    /// Tokens proposed in all.
    pub proposed: usize,
    /// Of those, the ones the target kept.
    pub accepted: usize,
    /// Of the accepted, those a predicted output proposed.
    pub accepted_prediction: usize,
    /// Proposed by a predicted output and rejected.
    pub rejected_prediction: usize,
    /// The time speculation saved, in seconds: the tokens its passes gave
    /// at the time a plain step of one sequence takes on this engine, less
    /// the passes' own time (negative where it cost time). `None` until
    /// the engine has timed a plain step.
    pub time_saved: Option<f64>,
}

/// One request's proposer and its adaptive `k`.
pub(crate) struct Proposer {
    pub(crate) spec: Speculation,
    /// Where in the prediction the answer is expected to go on.
    cursor: usize,
    /// The acceptance rate so far (an exponential average), for `k = 0`.
    rate: f32,
    /// The draft model's cache of this sequence.
    draft: DraftState,
    /// The MTP layer's state of this sequence, when it proposes.
    mtp: Option<MtpState>,
    pub(crate) usage: SpecUsage,
    /// Set when the last look found nothing to propose, or the proposer
    /// rests: the sequence then decodes on the plain path (whose steps
    /// overlap the host's work with the device's) until
    /// [`Proposer::wants`] finds something again.
    pub(crate) quiet: bool,
    /// Seconds this proposer takes to propose a token (an exponential
    /// average): nothing for lookup, a drafter's step for a draft model.
    propose_time: Option<f64>,
    /// Plain tokens to decode before proposing again, the rest after the
    /// next, and whether the rest just ended (the next pass explores).
    rest: usize,
    next_rest: usize,
    explore: bool,
}

/// Proposed tokens and where they came from.
pub(crate) struct Proposal {
    pub tokens: Vec<u32>,
    /// From the prediction (its cursor after them), or from lookup.
    from_prediction: Option<usize>,
    /// From the draft model, which had seen this many tokens of context.
    drafted_after: Option<usize>,
}

impl Proposal {
    fn none() -> Self {
        Self {
            tokens: Vec::new(),
            from_prediction: None,
            drafted_after: None,
        }
    }
}

impl Proposer {
    pub(crate) fn new(spec: Speculation) -> Self {
        Self {
            mtp: spec.mtp.then(MtpState::default),
            spec,
            cursor: 0,
            rate: 0.5,
            draft: DraftState::default(),
            usage: SpecUsage::default(),
            quiet: false,
            propose_time: None,
            rest: 0,
            next_rest: REST,
            explore: false,
        }
    }

    /// After a plain token: whether the proposer has something to propose
    /// after `prompt` and `answer` (see [`Proposer::wants`]) and is not
    /// resting.
    pub(crate) fn look(&mut self, prompt: &[u32], answer: &[u32]) {
        if self.rest > 0 {
            self.rest -= 1;
            self.explore = self.rest == 0;
            return;
        }
        let context: Vec<u32> = prompt.iter().chain(answer).copied().collect();
        self.quiet = !self.wants(&context, answer.len());
    }

    /// Whether [`Proposer::propose`] would propose anything after
    /// `context` (of which the last `answer_len` tokens are the answer),
    /// without proposing: a draft model and the MTP layer always do, a
    /// prediction where the answer still follows it, lookup after a match
    /// of [`MIN_LOOKUP_NGRAM`] tokens or more.
    pub(crate) fn wants(&self, context: &[u32], answer_len: usize) -> bool {
        if self.spec.draft_model || self.spec.mtp {
            return true;
        }
        if let Some(prediction) = self.spec.prediction.as_deref().filter(|p| !p.is_empty()) {
            let answer = &context[context.len() - answer_len..];
            let at = match answer_len {
                0 => Some(0),
                _ => follow(prediction, answer, self.cursor),
            };
            if at.is_some_and(|at| at < prediction.len()) {
                return true;
            }
        }
        self.spec.prompt_lookup && !lookup(context, 1).is_empty()
    }

    /// The MTP layer's state, when it proposes: the engine hands it the
    /// model's hidden states of the sequence.
    pub(crate) fn mtp(&mut self) -> Option<&mut MtpState> {
        self.mtp.as_mut()
    }

    /// How many tokens a proposer that is not a prediction proposes now,
    /// at most `limit` (`wanted` by the acceptance rate alone): for
    /// `k = 0`, the number expected to give the most tokens a second by
    /// the acceptance rate and what passes cost on this engine (`costs`),
    /// or none, and a rest, where no pass is expected to beat plain
    /// decoding. Each token is kept with the acceptance rate `a`, so a pass
    /// of `k` proposals gives `1 + a + ... + a^k` tokens. Until the engine
    /// has timed a pass of any size, `wanted`: a pass of unknown cost would
    /// be taken for a plain step's, so the longest would seem best, and on
    /// a device where each row costs nearly a step (a CPU's reference BLAS:
    /// 9 rows took 8.4 plain steps) the first pass would cost most.
    fn paying(&mut self, wanted: usize, limit: usize, costs: &Costs) -> usize {
        let timed = costs.measured();
        let Some(plain) = costs
            .plain
            .filter(|_| self.spec.k == 0 && !self.explore && timed)
        else {
            self.explore = false;
            return wanted;
        };
        let a = f64::from(self.rate);
        let propose = self.propose_time.unwrap_or(0.0);
        let best = (1..=limit.min(MAX_K))
            .map(|k| {
                let tokens = (0..=k).map(|i| a.powi(i as i32)).sum::<f64>();
                let time = costs.pass(k + 1, plain) + k as f64 * propose;
                (k, tokens / time)
            })
            .max_by(|x, y| x.1.total_cmp(&y.1));
        match best {
            Some((k, rate)) if rate * plain > 1.0 => {
                self.next_rest = REST;
                k
            }
            _ => {
                self.rest = self.next_rest;
                self.next_rest = (2 * self.next_rest).min(MAX_REST);
                0
            }
        }
    }

    /// Counts the time a proposal of `proposed` tokens took to make.
    pub(crate) fn proposed_in(&mut self, proposed: usize, seconds: f64) {
        if proposed > 0 {
            let each = seconds / proposed as f64;
            self.propose_time = Some(self.propose_time.map_or(each, |t| 0.7 * t + 0.3 * each));
        }
    }

    /// How many tokens to propose now, by the acceptance rate alone.
    fn k(&self) -> usize {
        match self.spec.k {
            0 => {
                // Expected kept tokens grow as rate / (1 - rate); propose
                // about twice that, at least one.
                let keep = self.rate / (1.0 - self.rate).max(0.05);
                ((2.0 * keep).round() as usize).clamp(1, MAX_K)
            }
            k => k.min(MAX_K),
        }
    }

    /// Up to `limit` tokens to follow `context` (the prompt and the answer
    /// so far), from `answer_len` tokens of answer; `drafter` is the
    /// engine's draft model, if it has one, and `model` the model whose MTP
    /// layer proposes (where `mtp` is on). A prediction that the answer
    /// follows comes first; the other proposers propose as many tokens as
    /// pay by `costs` (see [`Proposer::paying`]; all they want without).
    pub(crate) fn propose(
        &mut self,
        context: &[u32],
        answer_len: usize,
        limit: usize,
        drafter: Option<&Drafter>,
        model: Option<&Model>,
        costs: Option<&Costs>,
    ) -> Result<Proposal> {
        let k = self.k().min(limit);
        if k == 0 {
            return Ok(Proposal::none());
        }
        if let Some(prediction) = self.spec.prediction.as_deref().filter(|p| !p.is_empty()) {
            let at = if answer_len == 0 {
                Some(0)
            } else {
                let answer = &context[context.len() - answer_len..];
                follow(prediction, answer, self.cursor)
            };
            if let Some(at) = at.filter(|&at| at < prediction.len()) {
                if let (Some(mtp), Some(model)) = (self.mtp.as_mut(), model) {
                    // The layer keeps up with the sequence while the
                    // prediction proposes, ready for when the answer
                    // leaves it.
                    let arrays = mtp.catch_up(model, context.len(), |p| context[p])?;
                    mlx_rs::transforms::eval(&arrays)?;
                }
                let end = (at + k).min(prediction.len());
                return Ok(Proposal {
                    tokens: prediction[at..end].to_vec(),
                    from_prediction: Some(end),
                    drafted_after: None,
                });
            }
        }
        let lookup_only = !self.spec.mtp && !self.spec.draft_model;
        if lookup_only && (!self.spec.prompt_lookup || lookup(context, 1).is_empty()) {
            return Ok(Proposal::none());
        }
        let k = match costs {
            Some(costs) => self.paying(k, limit, costs),
            None => k,
        };
        if k == 0 {
            return Ok(Proposal::none());
        }
        if let (Some(mtp), Some(model)) = (self.mtp.as_mut(), model) {
            return Ok(Proposal {
                tokens: mtp.propose(model, context, k)?,
                ..Proposal::none()
            });
        }
        if let Some(drafter) = drafter.filter(|_| self.spec.draft_model) {
            return Ok(Proposal {
                tokens: drafter.propose(&mut self.draft, context, k)?,
                from_prediction: None,
                drafted_after: Some(context.len()),
            });
        }
        let tokens = if self.spec.prompt_lookup {
            lookup(context, k)
        } else {
            Vec::new()
        };
        Ok(Proposal {
            tokens,
            ..Proposal::none()
        })
    }

    /// Counts a verification of `proposal` of which `accepted` were kept.
    pub(crate) fn record(&mut self, proposal: &Proposal, accepted: usize) {
        let proposed = proposal.tokens.len();
        if let Some(context) = proposal.drafted_after {
            // The drafter saw every proposal but its last: it keeps those
            // the target kept.
            self.draft
                .keep(context + accepted.min(proposed.saturating_sub(1)));
        }
        if proposed == 0 {
            return;
        }
        let u = &mut self.usage;
        u.verifications += 1;
        u.proposed += proposed;
        u.accepted += accepted;
        if let Some(end) = proposal.from_prediction {
            u.accepted_prediction += accepted;
            u.rejected_prediction += proposed - accepted;
            // The answer goes on with one more token after the kept ones
            // (the target's own, in the prediction's place): the next step
            // expects the prediction one further, and finds it again by
            // matching where the answer left it.
            self.cursor = end - proposed + accepted + 1;
        }
        let rate = accepted as f32 / proposed as f32;
        self.rate = (0.7 * self.rate + 0.3 * rate).clamp(0.0, 0.95);
    }
}

/// Where in `prediction` the answer goes on: right after the longest
/// suffix of `answer` (up to [`MAX_NGRAM`] tokens, the last at least) that
/// occurs in it, the occurrence nearest after `cursor` first.
fn follow(prediction: &[u32], answer: &[u32], cursor: usize) -> Option<usize> {
    for n in (1..=MAX_NGRAM.min(answer.len())).rev() {
        let tail = &answer[answer.len() - n..];
        let ends = prediction
            .windows(n)
            .enumerate()
            .filter(|(_, w)| *w == tail)
            .map(|(i, _)| i + n);
        let (after, before): (Vec<usize>, Vec<usize>) = ends.partition(|&e| e >= cursor);
        if let Some(&end) = after.first().or(before.last()) {
            return Some(end);
        }
    }
    None
}

/// Prompt lookup: the up to `k` tokens that followed the latest earlier
/// occurrence of the longest suffix of `context` (of [`MAX_NGRAM`] tokens
/// down to [`MIN_LOOKUP_NGRAM`]) that occurred before.
pub(crate) fn lookup(context: &[u32], k: usize) -> Vec<u32> {
    let len = context.len();
    for n in (MIN_LOOKUP_NGRAM..=MAX_NGRAM.min(len.saturating_sub(1))).rev() {
        let tail = &context[len - n..];
        // Latest start first, the suffix itself excluded.
        for start in (0..len - n).rev() {
            if &context[start..start + n] == tail {
                let from = start + n;
                let to = (from + k).min(len);
                return context[from..to].to_vec();
            }
        }
    }
    Vec::new()
}

/// The greedy verification: how many of `proposed` agree with `choices`
/// (the target's greedy token after the last input and after each
/// proposal), and the token after the kept ones.
pub(crate) fn verify_greedy(proposed: &[u32], choices: &[u32]) -> (usize, u32) {
    let kept = proposed
        .iter()
        .zip(choices)
        .take_while(|(p, c)| p == c)
        .count();
    (kept, choices[kept])
}

/// The sampled verification of `proposed` (each proposed with certainty)
/// against the target's distributions `rows` (the one after the last input,
/// then after each proposal: `proposed.len() + 1` rows of probabilities):
/// proposal `i` is kept when a uniform draw falls below `rows[i][d]`; the
/// first rejected is replaced by a draw from `rows[i]` without it; when all
/// are kept, the last row gives one more token. `uniform` gives draws in
/// `[0, 1)`. Returns how many were kept and the token after them.
pub(crate) fn verify_sampled(
    proposed: &[u32],
    rows: &[&[f32]],
    mut uniform: impl FnMut() -> f32,
) -> (usize, u32) {
    for (i, &d) in proposed.iter().enumerate() {
        let p = rows[i];
        let pd = p.get(d as usize).copied().unwrap_or(0.0);
        if uniform() < pd {
            continue;
        }
        return (i, draw(p, Some(d), uniform()));
    }
    let last = rows[proposed.len()];
    (proposed.len(), draw(last, None, uniform()))
}

/// The token of `p` (probabilities, not necessarily summing to one) whose
/// share holds `u` times the total, leaving out `without`.
fn draw(p: &[f32], without: Option<u32>, u: f32) -> u32 {
    let weight = |t: usize, w: f32| if Some(t as u32) == without { 0.0 } else { w };
    let total: f64 = p
        .iter()
        .enumerate()
        .map(|(t, &w)| weight(t, w) as f64)
        .sum();
    let point = u as f64 * total;
    let mut run = 0.0f64;
    let mut last = 0;
    for (t, &w) in p.iter().enumerate() {
        let w = weight(t, w) as f64;
        if w <= 0.0 {
            continue;
        }
        run += w;
        last = t;
        if point < run {
            return t as u32;
        }
    }
    last as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_takes_what_followed_the_latest_match() {
        // "1 2 3" occurs at 0 and at 5; the latest earlier one wins.
        let context = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 1, 2, 3];
        assert_eq!(lookup(&context, 2), vec![7, 8]);
        // Shorter n-grams after longer ones; the context's end bounds it.
        assert_eq!(lookup(&[5, 6, 4, 5, 6], 5), vec![4, 5, 6]);
        // A match of one token proposes nothing.
        assert_eq!(lookup(&[5, 6, 4, 6], 3), Vec::<u32>::new());
        assert_eq!(lookup(&[1, 2, 3], 3), Vec::<u32>::new());
        assert_eq!(lookup(&[], 3), Vec::<u32>::new());
    }

    #[test]
    fn prediction_is_followed_where_the_answer_matches_it() {
        let mut p = Proposer::new(Speculation {
            prediction: Some(vec![10, 11, 12, 13, 14, 15]),
            k: 3,
            ..Speculation::default()
        });
        let prompt = [1, 2];
        // No answer yet: the prediction's head.
        assert_eq!(
            p.propose(&prompt, 0, 8, None, None, None).unwrap().tokens,
            vec![10, 11, 12]
        );
        // The answer took 10 11 then went its own way (20): nothing
        // matches 20, and lookup is off.
        let proposal = p
            .propose(&[1, 2, 10, 11, 20], 3, 8, None, None, None)
            .unwrap();
        assert!(proposal.tokens.is_empty());
        // Back on it at 13: the prediction goes on after it.
        let proposal = p
            .propose(&[1, 2, 10, 11, 20, 13], 4, 2, None, None, None)
            .unwrap();
        assert_eq!(proposal.tokens, vec![14, 15]);
        p.record(&proposal, 1);
        assert_eq!(p.usage.accepted_prediction, 1);
        assert_eq!(p.usage.rejected_prediction, 1);
    }

    /// Costs where a verifying pass of `rows` rows takes `per_row(rows)`
    /// plain steps of 10 ms, for 2 to 9 rows.
    fn costs(per_row: impl Fn(usize) -> f64) -> Costs {
        let mut c = Costs {
            plain: Some(0.010),
            ..Costs::default()
        };
        for rows in 2..=MAX_K + 1 {
            c.verified(rows, 0.010 * per_row(rows));
        }
        c
    }

    #[test]
    fn a_pass_is_expected_to_cost_what_passes_of_its_size_cost() {
        let mut c = Costs {
            plain: Some(0.010),
            ..Costs::default()
        };
        // Nothing measured: a plain step.
        assert_eq!(c.pass(5, 0.010), 0.010);
        // One size measured: the line from a plain step through it.
        c.verified(3, 0.030);
        assert!((c.pass(5, 0.010) - 0.050).abs() < 1e-12);
        assert_eq!(c.pass(3, 0.010), 0.030);
        // The measured size nearest to it draws the line.
        c.verified(9, 0.018);
        assert!((c.pass(8, 0.010) - 0.017).abs() < 1e-12);
    }

    #[test]
    fn proposals_are_made_only_where_a_pass_is_expected_to_pay() {
        let lookup = || {
            Proposer::new(Speculation {
                prompt_lookup: true,
                ..Speculation::default()
            })
        };
        // Before any pass is timed: as many as the rate wants, not the
        // most a pass could hold.
        let untimed = Costs {
            plain: Some(0.010),
            ..Costs::default()
        };
        assert_eq!(lookup().paying(2, MAX_K, &untimed), 2);
        // A device where a pass of any size costs 1.3 plain steps (an H100
        // at 7B): at the starting rate of 0.5 a pass pays, with many tokens.
        let mut p = lookup();
        let k = p.paying(2, MAX_K, &costs(|_| 1.3));
        assert!(k >= 2, "{k}");
        // A CPU where each row of a pass costs most of a plain step (the
        // reference BLAS): at 0.5 no size pays, so the proposer rests,
        // then explores once.
        let cpu = costs(|rows| 0.2 + 0.8 * rows as f64);
        let mut p = lookup();
        assert_eq!(p.paying(2, MAX_K, &cpu), 0);
        p.quiet = true;
        for _ in 0..REST {
            p.look(&[1, 2, 3, 1, 2], &[]);
            assert!(p.quiet);
        }
        p.look(&[1, 2, 3, 1, 2], &[]);
        assert!(p.explore && !p.quiet);
        assert_eq!(p.paying(2, MAX_K, &cpu), 2);
        // The rest doubles while passes do not pay.
        assert_eq!(p.paying(2, MAX_K, &cpu), 0);
        assert_eq!(p.rest, 2 * REST);
        // Where nearly everything is kept, even those passes pay (short
        // ones; a pass costing a whole step a row never could).
        for _ in 0..20 {
            p.record(
                &Proposal {
                    tokens: vec![0; 4],
                    ..Proposal::none()
                },
                4,
            );
        }
        assert!(p.paying(2, MAX_K, &cpu) > 0);
        // A fixed k is the operator's: proposed whatever it costs.
        let mut p = Proposer::new(Speculation {
            prompt_lookup: true,
            k: 3,
            ..Speculation::default()
        });
        assert_eq!(p.paying(3, MAX_K, &cpu), 3);
    }

    #[test]
    fn lookup_is_wanted_after_a_match_of_two_tokens() {
        let p = Proposer::new(Speculation {
            prompt_lookup: true,
            ..Speculation::default()
        });
        assert!(p.wants(&[4, 5, 6, 4, 5], 0));
        assert!(!p.wants(&[4, 5, 6, 7, 5], 0));
        // A prediction is wanted while the answer follows it.
        let p = Proposer::new(Speculation {
            prediction: Some(vec![10, 11, 12]),
            ..Speculation::default()
        });
        assert!(p.wants(&[1, 2], 0));
        assert!(p.wants(&[1, 2, 10], 1));
        assert!(!p.wants(&[1, 2, 10, 11, 12], 3));
        assert!(!p.wants(&[1, 2, 30], 1));
    }

    #[test]
    fn adaptive_k_follows_the_acceptance_rate() {
        let mut p = Proposer::new(Speculation {
            prompt_lookup: true,
            ..Speculation::default()
        });
        let proposal = |n| Proposal {
            tokens: vec![0; n],
            ..Proposal::none()
        };
        for _ in 0..20 {
            p.record(&proposal(4), 4);
        }
        assert_eq!(p.k(), MAX_K);
        for _ in 0..20 {
            p.record(&proposal(4), 0);
        }
        assert_eq!(p.k(), 1);
    }

    #[test]
    fn greedy_verification_keeps_the_agreeing_prefix() {
        assert_eq!(verify_greedy(&[5, 6, 7], &[5, 6, 9, 1]), (2, 9));
        assert_eq!(verify_greedy(&[5, 6], &[5, 6, 4]), (2, 4));
        assert_eq!(verify_greedy(&[], &[3]), (0, 3));
    }

    /// A small deterministic generator of uniform draws.
    fn uniforms(seed: u64) -> impl FnMut() -> f32 {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 24) as f32
        }
    }

    /// Rejection sampling keeps the target's distribution whatever is
    /// proposed: the first token's frequencies over many draws match `p`
    /// (a chi-square test with a fixed seed), for a likely, an unlikely
    /// and an impossible proposal.
    #[test]
    fn sampled_verification_keeps_the_target_distribution() {
        let p = [0.5f32, 0.25, 0.15, 0.1, 0.0];
        let second = [0.2f32, 0.2, 0.2, 0.2, 0.2];
        for proposal in [0u32, 3, 4] {
            let mut u = uniforms(7 + u64::from(proposal));
            let draws = 40_000;
            let mut counts = [0usize; 5];
            for _ in 0..draws {
                let (kept, next) = verify_sampled(&[proposal], &[&p, &second], &mut u);
                let first = if kept == 1 { proposal } else { next };
                counts[first as usize] += 1;
            }
            assert_eq!(counts[4], 0, "an impossible token is never taken");
            let chi2: f64 = p
                .iter()
                .zip(counts)
                .filter(|(&p, _)| p > 0.0)
                .map(|(&p, c)| {
                    let expected = p as f64 * draws as f64;
                    (c as f64 - expected).powi(2) / expected
                })
                .sum();
            // 3 degrees of freedom: 16.27 is the 0.001 quantile.
            assert!(
                chi2 < 16.27,
                "proposal {proposal}: chi2 {chi2}, counts {counts:?}"
            );
        }
    }
}
