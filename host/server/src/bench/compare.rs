//! What may be compared, and the comparison: engines in one run must read
//! the same model files and be measured alike (all after a warm-up, or one
//! engine alone without); a run compared with an earlier one must have
//! measured the same way, and each change is marked as noise when it lies
//! within the spread either run measured.

use std::collections::BTreeMap;

use super::report::{EngineResult, ModelInfo, Protocol, Report, SCHEMA};
use super::stats::{change, percent, Change, Direction, Summary};

/// Why two measurements are not comparable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum NotComparable {
    /// Two engines would read different model files.
    #[error(
        "not comparable: {a} would read other model files than {b}:\n{side_by_side}\n\
         the same weights in another format are other files; pass --allow-different-files \
         to measure them anyway (the files are then shown side by side)"
    )]
    DifferentFiles {
        /// `engine on model`.
        a: String,
        /// `engine on model`.
        b: String,
        /// Both file lists, a line per file.
        side_by_side: String,
    },
    /// Without a warm-up, the first engine reads the files from disk and
    /// the later ones from the page cache.
    #[error(
        "not comparable: without a warm-up the first engine would be measured cold (its model \
         files read from disk) and the others warm (from the page cache); drop --no-warmup, or \
         bench one engine at a time"
    )]
    ColdAgainstWarm,
    /// The earlier run measured otherwise.
    #[error("not comparable with {file}: {reason}; run again with the earlier run's options")]
    Protocol {
        /// The earlier run's file.
        file: String,
        /// What differs.
        reason: String,
    },
}

/// The label of a measured pair.
fn label(engine: &str, model: &ModelInfo) -> String {
    format!("{engine} on {}", model.id)
}

/// Both file lists, one line per file name.
fn side_by_side(a: &ModelInfo, b: &ModelInfo) -> String {
    let describe = |m: &ModelInfo, name: &str| {
        m.files
            .iter()
            .find(|f| f.name == name)
            .map_or("(absent)".to_string(), |f| {
                format!(
                    "{} B {}",
                    f.size,
                    f.sha256.as_deref().map_or("unhashed".into(), |h| format!(
                        "{} {}",
                        f.hashed,
                        &h[..12.min(h.len())]
                    ))
                )
            })
    };
    let mut names: Vec<&str> = a
        .files
        .iter()
        .chain(&b.files)
        .map(|f| f.name.as_str())
        .collect();
    names.sort_unstable();
    names.dedup();
    names
        .iter()
        .map(|n| format!("  {n}: {} | {}", describe(a, n), describe(b, n)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Checks that every engine of a run reads the same files as the first.
pub(crate) fn check_same_files(
    pairs: &[(&str, &ModelInfo)],
    allow_different_files: bool,
) -> Result<(), NotComparable> {
    if allow_different_files {
        return Ok(());
    }
    let Some((first_engine, first)) = pairs.first() else {
        return Ok(());
    };
    for (engine, model) in &pairs[1..] {
        if model.files != first.files {
            return Err(NotComparable::DifferentFiles {
                a: label(first_engine, first),
                b: label(engine, model),
                side_by_side: side_by_side(first, model),
            });
        }
    }
    Ok(())
}

/// Checks that the engines of a run are measured alike.
pub(crate) fn check_warmup(warmup: bool, engines: usize) -> Result<(), NotComparable> {
    if !warmup && engines > 1 {
        return Err(NotComparable::ColdAgainstWarm);
    }
    Ok(())
}

/// One measure's change between two runs.
#[derive(Debug, Clone)]
pub(crate) struct Delta {
    /// `engine on model`.
    pub pair: String,
    /// The measure (`decode tok/s @128`).
    pub measure: String,
    /// Earlier and now.
    pub before: Summary,
    /// See `before`.
    pub after: Summary,
    /// Noise, better or worse.
    pub change: Change,
}

/// The comparison of `now` with `earlier`.
#[derive(Debug, Clone)]
pub(crate) struct Comparison {
    /// Every measure both runs have.
    pub deltas: Vec<Delta>,
    /// Pairs measured in only one of the runs.
    pub unmatched: Vec<String>,
}

/// Checks, before measuring, that a run with `now` would be comparable
/// with `earlier` (read from `file`).
pub(crate) fn check_protocol(
    earlier: &Report,
    file: &str,
    now: &Protocol,
) -> Result<(), NotComparable> {
    let refuse = |reason: String| NotComparable::Protocol {
        file: file.to_string(),
        reason,
    };
    if earlier.schema != SCHEMA {
        return Err(refuse(format!(
            "it is a record of schema {}, this hangar writes {SCHEMA}",
            earlier.schema
        )));
    }
    let (a, b) = (&earlier.protocol, now);
    if a.warmup != b.warmup {
        return Err(refuse(format!(
            "one run was measured {} and the other {}: one engine warm and another cold",
            if a.warmup {
                "after a warm-up"
            } else {
                "cold, without a warm-up"
            },
            if b.warmup {
                "after a warm-up"
            } else {
                "cold, without a warm-up"
            },
        )));
    }
    let differs = |what: &str, x: String, y: String| {
        (x != y).then(|| format!("it measured {what} {x}, this run {y}"))
    };
    if let Some(reason) = differs(
        "prompts of",
        format!("{:?} words", a.prompt_tokens),
        format!("{:?} words", b.prompt_tokens),
    )
    .or_else(|| {
        differs(
            "answers of",
            format!("{} tokens", a.gen_tokens),
            format!("{} tokens", b.gen_tokens),
        )
    })
    .or_else(|| {
        differs(
            "concurrency",
            format!("{:?}", a.concurrency),
            format!("{:?}", b.concurrency),
        )
    })
    .or_else(|| {
        differs(
            "at temperature",
            a.temperature.to_string(),
            b.temperature.to_string(),
        )
    }) {
        return Err(refuse(reason));
    }
    Ok(())
}

/// Compares `now` with `earlier` (read from `file`), refusing runs that
/// measured otherwise or, unless allowed, read other model files.
pub(crate) fn compare(
    earlier: &Report,
    file: &str,
    now: &Report,
) -> Result<Comparison, NotComparable> {
    let refuse = |reason: String| NotComparable::Protocol {
        file: file.to_string(),
        reason,
    };
    check_protocol(earlier, file, &now.protocol)?;
    let (a, b) = (&earlier.protocol, &now.protocol);
    let key = |e: &EngineResult| (e.engine.clone(), e.model.id.clone());
    let before: BTreeMap<_, _> = earlier.engines.iter().map(|e| (key(e), e)).collect();
    let mut deltas = Vec::new();
    let mut unmatched = Vec::new();
    for e in &now.engines {
        let Some(old) = before.get(&key(e)) else {
            unmatched.push(format!("{} (only in this run)", label(&e.engine, &e.model)));
            continue;
        };
        if old.model.files != e.model.files && !(a.allow_different_files && b.allow_different_files)
        {
            return Err(refuse(format!(
                "{} read other model files in that run:\n{}\n(pass --allow-different-files to both runs to compare them anyway)",
                label(&e.engine, &e.model),
                side_by_side(&old.model, &e.model)
            )));
        }
        let pair = label(&e.engine, &e.model);
        let mut push = |measure: String, x: Option<&Summary>, y: Option<&Summary>, d| {
            if let (Some(x), Some(y)) = (x, y) {
                deltas.push(Delta {
                    pair: pair.clone(),
                    measure,
                    before: x.clone(),
                    after: y.clone(),
                    change: change(x, y, d),
                });
            }
        };
        use Direction::*;
        push(
            "load s".into(),
            old.load_s.as_ref(),
            e.load_s.as_ref(),
            LowerIsBetter,
        );
        for p in &b.prompt_tokens {
            push(
                format!("TTFT cold s @{p}"),
                old.ttft_cold_s.get(p),
                e.ttft_cold_s.get(p),
                LowerIsBetter,
            );
            push(
                format!("TTFT warm s @{p}"),
                old.ttft_warm_s.get(p),
                e.ttft_warm_s.get(p),
                LowerIsBetter,
            );
            push(
                format!("decode tok/s @{p}"),
                old.decode_tps.get(p),
                e.decode_tps.get(p),
                HigherIsBetter,
            );
        }
        for c in &b.concurrency {
            push(
                format!("tok/s x{c}"),
                old.aggregate_tps.get(c),
                e.aggregate_tps.get(c),
                HigherIsBetter,
            );
        }
        // Records written before speculation was measured, and engines
        // that did not speculate, have none: nothing to compare.
        push(
            "acceptance rate".into(),
            old.speculation
                .as_ref()
                .and_then(|s| s.acceptance_rate.as_ref()),
            e.speculation
                .as_ref()
                .and_then(|s| s.acceptance_rate.as_ref()),
            HigherIsBetter,
        );
        push(
            "tokens/verification".into(),
            old.speculation
                .as_ref()
                .and_then(|s| s.tokens_per_verification.as_ref()),
            e.speculation
                .as_ref()
                .and_then(|s| s.tokens_per_verification.as_ref()),
            HigherIsBetter,
        );
        push(
            "peak RSS bytes".into(),
            old.peak_rss_bytes.as_ref(),
            e.peak_rss_bytes.as_ref(),
            LowerIsBetter,
        );
        push(
            "peak GPU bytes".into(),
            old.peak_gpu_bytes.as_ref(),
            e.peak_gpu_bytes.as_ref(),
            LowerIsBetter,
        );
    }
    let now_keys: Vec<_> = now.engines.iter().map(key).collect();
    for old in &earlier.engines {
        if !now_keys.contains(&key(old)) {
            unmatched.push(format!(
                "{} (only in {file})",
                label(&old.engine, &old.model)
            ));
        }
    }
    Ok(Comparison { deltas, unmatched })
}

/// A median as the table shows it: four decimals for small values, none
/// for large ones (bytes).
fn number(v: f64) -> String {
    if v.abs() >= 1000.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.4}")
    }
}

/// The comparison as lines of text.
pub(crate) fn render(c: &Comparison) -> String {
    let mut t = hangar_engine::text::table(&["engine", "measure", "earlier", "now", "change", ""]);
    for d in &c.deltas {
        t.add_row(vec![
            d.pair.clone(),
            d.measure.clone(),
            number(d.before.median),
            number(d.after.median),
            percent(&d.before, &d.after).map_or("-".into(), |p| format!("{p:+.1}%")),
            match d.change {
                Change::Noise => "noise (within the spread)".into(),
                Change::Better => "better".into(),
                Change::Worse => "worse".into(),
            },
        ]);
    }
    let mut out = t.to_string();
    for u in &c.unmatched {
        out.push_str(&format!("\n- {u}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{engine, model, report, speculating};
    use super::*;
    use expect_test::{expect, Expect};

    fn check(result: Result<String, NotComparable>, expected: Expect) {
        expected.assert_eq(&result.unwrap_or_else(|e| format!("refused: {e}")));
    }

    #[test]
    fn engines_of_one_run_must_read_the_same_files() {
        let (a, b, gguf) = (
            model("tiny", "1111111111111111"),
            model("tiny", "1111111111111111"),
            model("tiny-gguf", "2222222222222222"),
        );
        let run = |pairs: &[(&str, &ModelInfo)], allow| {
            check_same_files(pairs, allow).map(|()| "ok".to_string())
        };
        check(
            run(&[("native-mlx", &a), ("mlx-lm", &b)], false),
            expect!["ok"],
        );
        check(
            run(&[("native-mlx", &a), ("llama-server", &gguf)], true),
            expect!["ok"],
        );
        check(
            run(
                &[("native-mlx", &a), ("mlx-lm", &b), ("llama-server", &gguf)],
                false,
            ),
            expect![[r#"
            refused: not comparable: native-mlx on tiny would read other model files than llama-server on tiny-gguf:
              config.json: 10 B file aaaaaaaaaaaa | 10 B file aaaaaaaaaaaa
              model.safetensors: 99 B header 111111111111 | 99 B header 222222222222
            the same weights in another format are other files; pass --allow-different-files to measure them anyway (the files are then shown side by side)"#]],
        );
        check(check_warmup(false, 1).map(|()| "ok".into()), expect!["ok"]);
        check(check_warmup(true, 3).map(|()| "ok".into()), expect!["ok"]);
        check(check_warmup(false, 2).map(|()| "ok".into()), expect!["refused: not comparable: without a warm-up the first engine would be measured cold (its model files read from disk) and the others warm (from the page cache); drop --no-warmup, or bench one engine at a time"]);
    }

    #[test]
    fn comparisons_mark_noise_and_refuse_other_protocols() {
        let m = model("tiny", "1111111111111111");
        let earlier = report(
            true,
            16,
            vec![
                engine("native-mlx", m.clone(), &[100.0, 110.0], &[0.010, 0.012]),
                engine("gone", m.clone(), &[1.0], &[1.0]),
            ],
        );
        let now = report(
            true,
            16,
            vec![
                engine("native-mlx", m.clone(), &[150.0, 160.0], &[0.011, 0.013]),
                engine("mlx-lm", m.clone(), &[50.0], &[0.05]),
            ],
        );
        let run = |a: &Report, b: &Report| compare(a, "old.json", b).map(|c| render(&c));
        check(
            run(&earlier, &now),
            expect![[r#"
             engine              measure          earlier   now       change                            
             native-mlx on tiny  load s           1.0500    1.0500    +0.0%   noise (within the spread) 
             native-mlx on tiny  TTFT cold s @8   0.0110    0.0120    +9.1%   noise (within the spread) 
             native-mlx on tiny  decode tok/s @8  105.0000  155.0000  +47.6%  better                    
            - mlx-lm on tiny (only in this run)
            - gone on tiny (only in old.json)"#]],
        );
        let cold = report(false, 16, vec![]);
        check(run(&cold, &now), expect!["refused: not comparable with old.json: one run was measured cold, without a warm-up and the other after a warm-up: one engine warm and another cold; run again with the earlier run's options"]);
        check(run(&report(true, 32, vec![]), &now), expect!["refused: not comparable with old.json: it measured answers of 32 tokens, this run 16 tokens; run again with the earlier run's options"]);
        let other = report(
            true,
            16,
            vec![engine(
                "native-mlx",
                model("tiny", "3333333333333333"),
                &[1.0],
                &[1.0],
            )],
        );
        check(
            run(&other, &now),
            expect![[r#"
            refused: not comparable with old.json: native-mlx on tiny read other model files in that run:
              config.json: 10 B file aaaaaaaaaaaa | 10 B file aaaaaaaaaaaa
              model.safetensors: 99 B header 333333333333 | 99 B header 111111111111
            (pass --allow-different-files to both runs to compare them anyway); run again with the earlier run's options"#]],
        );
    }

    #[test]
    fn speculation_compares_where_both_runs_measured_it() {
        let m = model("tiny", "1111111111111111");
        let plain = || engine("native-mlx", m.clone(), &[100.0, 110.0], &[0.010, 0.012]);
        let spec = |rounds: &[(u64, u64, u64)]| speculating(plain(), rounds);
        let run = |a: Vec<EngineResult>, b: Vec<EngineResult>| {
            compare(&report(true, 16, a), "old.json", &report(true, 16, b)).map(|c| render(&c))
        };
        // An earlier record without speculation (an older hangar's, or an
        // engine that did not speculate) compares on the other measures.
        check(
            run(
                vec![plain()],
                vec![
                    spec(&[(10, 40, 20), (10, 40, 24)]),
                    engine("mlx-lm", m.clone(), &[50.0], &[0.05]),
                ],
            ),
            expect![[r#"
                 engine              measure          earlier   now       change                            
                 native-mlx on tiny  load s           1.0500    1.0500    +0.0%   noise (within the spread) 
                 native-mlx on tiny  TTFT cold s @8   0.0110    0.0110    +0.0%   noise (within the spread) 
                 native-mlx on tiny  decode tok/s @8  105.0000  105.0000  +0.0%   noise (within the spread) 
                - mlx-lm on tiny (only in this run)"#]],
        );
        check(
            run(
                vec![
                    spec(&[(10, 40, 20), (10, 40, 24)]),
                    engine("mlx-lm", m.clone(), &[50.0], &[0.05]),
                ],
                vec![spec(&[(10, 40, 30), (10, 40, 32)])],
            ),
            expect![[r#"
                 engine              measure              earlier   now       change                            
                 native-mlx on tiny  load s               1.0500    1.0500    +0.0%   noise (within the spread) 
                 native-mlx on tiny  TTFT cold s @8       0.0110    0.0110    +0.0%   noise (within the spread) 
                 native-mlx on tiny  decode tok/s @8      105.0000  105.0000  +0.0%   noise (within the spread) 
                 native-mlx on tiny  acceptance rate      0.5500    0.7750    +40.9%  better                    
                 native-mlx on tiny  tokens/verification  3.2000    4.1000    +28.1%  better                    
                - mlx-lm on tiny (only in old.json)"#]],
        );
    }
}
