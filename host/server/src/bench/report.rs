//! A benchmark's record (what `--json-file` writes and `--compare` reads)
//! and its human forms: the table on stdout and the Markdown file.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::files::FileFingerprint;
use super::stats::Summary;
use hangar_engine::text::table;

/// The version of this record's shape; `--compare` refuses another.
pub(crate) const SCHEMA: u32 = 1;

/// One benchmark run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Report {
    /// [`SCHEMA`].
    pub schema: u32,
    /// Hangar's version.
    pub hangar_version: String,
    /// When the run started and ended (RFC 3339, UTC).
    pub started_at: String,
    /// See `started_at`.
    pub ended_at: String,
    /// The 1/5/15 minute load averages at the start and the end.
    pub load_average: LoadAverage,
    /// The machine.
    pub platform: PlatformInfo,
    /// How it was measured.
    pub protocol: Protocol,
    /// The prompts sent, as the seed made them.
    pub prompts: Vec<PromptInfo>,
    /// Every engine measured, in the order run.
    pub engines: Vec<EngineResult>,
}

/// Load averages.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct LoadAverage {
    /// At the start.
    pub start: Option<[f64; 3]>,
    /// At the end.
    pub end: Option<[f64; 3]>,
}

/// The machine.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PlatformInfo {
    /// `os/arch/accelerators` as plugins see it.
    pub platform: String,
    /// The CPU's model name.
    pub cpu_model: Option<String>,
    /// Logical CPUs.
    pub cpus: usize,
    /// Memory in bytes.
    pub memory_bytes: Option<u64>,
}

/// How a run measured: two runs compare only when these agree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Protocol {
    /// Measured rounds per engine.
    pub rounds: u32,
    /// Whether every engine had a warm-up load and request first.
    pub warmup: bool,
    /// The prompt sizes, in words (about one token each).
    pub prompt_tokens: Vec<u32>,
    /// Tokens asked for per answer.
    pub gen_tokens: u32,
    /// The concurrencies measured.
    pub concurrency: Vec<u32>,
    /// The sampling temperature (0: greedy).
    pub temperature: f64,
    /// The prompts' seed.
    pub seed: u64,
    /// Always `interleaved`: round r of every engine, then round r+1.
    pub order: String,
    /// Whether different model files per engine were allowed.
    pub allow_different_files: bool,
}

/// One prompt sent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PromptInfo {
    /// What it was for: `warmup`, `round-R`, `round-R-cN-I`.
    pub purpose: String,
    /// Its length in words.
    pub words: u32,
    /// The SHA-256 of its text.
    pub sha256: String,
    /// Its first words.
    pub start: String,
}

/// One engine's measurements of one model.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct EngineResult {
    /// The plugin id.
    pub engine: String,
    /// The plugin's version.
    pub plugin_version: String,
    /// The engine version its probe read.
    pub engine_version: Option<String>,
    /// The model measured.
    pub model: ModelInfo,
    /// The settings in effect for the model with this engine (the host's
    /// `GET /api/models/{id}/settings`).
    pub settings: Value,
    /// Seconds from the load request to the engine being ready.
    pub load_s: Option<Summary>,
    /// Prompt size → time to first token of a prompt the engine never saw.
    pub ttft_cold_s: BTreeMap<u32, Summary>,
    /// Prompt size → time to first token of the same prompt again.
    pub ttft_warm_s: BTreeMap<u32, Summary>,
    /// Prompt size → tokens/s after the first token, one stream.
    pub decode_tps: BTreeMap<u32, Summary>,
    /// Prompt size → the prompt tokens the engine counted.
    pub prompt_tokens_counted: BTreeMap<u32, u64>,
    /// Concurrency → every stream's tokens over the wall time.
    pub aggregate_tps: BTreeMap<u32, Summary>,
    /// The engine's process tree's peak resident memory per round (bytes);
    /// for an engine inside the host, the host's.
    pub peak_rss_bytes: Option<Summary>,
    /// The same processes' peak memory on NVIDIA GPUs per round (bytes);
    /// none without `nvidia-smi` or where no round used a GPU.
    #[serde(default)]
    pub peak_gpu_bytes: Option<Summary>,
    /// Answers that ended before `gen_tokens` (an end-of-sequence token):
    /// their rates cover fewer tokens.
    #[serde(default)]
    pub answers_short: u32,
    /// What the memory measures: `engine process tree` or `host process`.
    pub rss_of: String,
    /// What speculative decoding did, where the engine speculated (absent
    /// where it did not, and in records written before it was measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculation: Option<Speculation>,
}

/// The host's `usage.speculation` of one answer, or summed over several:
/// what speculative decoding did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SpeculationCounts {
    /// The model's passes that verified proposed tokens.
    pub verifications: u64,
    /// Tokens proposed for verification.
    pub proposed_tokens: u64,
    /// Proposed tokens the model kept.
    pub accepted_tokens: u64,
    /// The time speculation saved, as the engine estimates it (negative
    /// where it cost time); `None` where the engine gives no estimate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_saved_ms: Option<i64>,
}

impl SpeculationCounts {
    /// The share of the proposed tokens the model kept (`None` where none
    /// was proposed).
    pub(crate) fn acceptance_rate(&self) -> Option<f64> {
        (self.proposed_tokens > 0)
            .then(|| self.accepted_tokens as f64 / self.proposed_tokens as f64)
    }

    /// The tokens each verifying pass gave: the kept ones, and the model's
    /// own token after them (`None` without a pass).
    pub(crate) fn tokens_per_verification(&self) -> Option<f64> {
        (self.verifications > 0)
            .then(|| (self.accepted_tokens + self.verifications) as f64 / self.verifications as f64)
    }
}

impl std::iter::Sum for SpeculationCounts {
    fn sum<I: Iterator<Item = SpeculationCounts>>(iter: I) -> SpeculationCounts {
        iter.fold(SpeculationCounts::default(), |a, b| SpeculationCounts {
            verifications: a.verifications + b.verifications,
            proposed_tokens: a.proposed_tokens + b.proposed_tokens,
            accepted_tokens: a.accepted_tokens + b.accepted_tokens,
            time_saved_ms: match (a.time_saved_ms, b.time_saved_ms) {
                (None, None) => None,
                (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
            },
        })
    }
}

/// Speculative decoding over an engine's measured answers. The rates are
/// taken per round, over every measured answer of the round (cold, warm
/// and concurrent), so that they are medians of rounds like every other
/// measure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Speculation {
    /// The counts over every round.
    #[serde(flatten)]
    pub total: SpeculationCounts,
    /// Per round: the share of the proposed tokens the model kept.
    pub acceptance_rate: Option<Summary>,
    /// Per round: the tokens each verifying pass gave (the kept ones and
    /// the model's own after them).
    pub tokens_per_verification: Option<Summary>,
    /// Per round: the seconds speculation saved over the round's answers,
    /// by the engine's estimates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_saved_s: Option<Summary>,
}

impl Speculation {
    /// The record of the counts of the rounds that speculated, one per
    /// round; `None` where none did.
    pub(crate) fn of(rounds: &[SpeculationCounts]) -> Option<Speculation> {
        if rounds.is_empty() {
            return None;
        }
        let per_round = |rate: fn(&SpeculationCounts) -> Option<f64>| {
            Summary::of(&rounds.iter().filter_map(rate).collect::<Vec<_>>())
        };
        Some(Speculation {
            total: rounds.iter().copied().sum(),
            acceptance_rate: per_round(SpeculationCounts::acceptance_rate),
            tokens_per_verification: per_round(SpeculationCounts::tokens_per_verification),
            time_saved_s: per_round(|c| c.time_saved_ms.map(|ms| ms as f64 / 1e3)),
        })
    }
}

/// A model, as measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ModelInfo {
    /// The id clients use.
    pub id: String,
    /// Its format.
    pub format: String,
    /// Where it is.
    pub path: String,
    /// Its files.
    pub files: Vec<FileFingerprint>,
}

/// `0.123 (0.101–0.150)`, or `-`.
pub(crate) fn cell(s: Option<&Summary>, scale: f64, digits: usize) -> String {
    match s {
        Some(s) => format!(
            "{:.d$} ({:.d$}–{:.d$})",
            s.median * scale,
            s.min * scale,
            s.max * scale,
            d = digits
        ),
        None => "-".into(),
    }
}

/// A column of the table: its header, and its cell for an engine.
type Column = (String, Box<dyn Fn(&EngineResult) -> String>);

/// The columns of the table.
fn columns(report: &Report) -> Vec<Column> {
    let mut cols: Vec<Column> = vec![
        (
            "engine".into(),
            Box::new(|e: &EngineResult| {
                format!(
                    "{} {}",
                    e.engine,
                    e.engine_version.as_deref().unwrap_or("?")
                )
            }),
        ),
        (
            "model".into(),
            Box::new(|e: &EngineResult| e.model.id.clone()),
        ),
        (
            "load s".into(),
            Box::new(|e: &EngineResult| cell(e.load_s.as_ref(), 1.0, 2)),
        ),
    ];
    for &p in &report.protocol.prompt_tokens {
        cols.push((
            format!("TTFT cold ms @{p}"),
            Box::new(move |e: &EngineResult| cell(e.ttft_cold_s.get(&p), 1000.0, 1)),
        ));
        cols.push((
            format!("TTFT warm ms @{p}"),
            Box::new(move |e: &EngineResult| cell(e.ttft_warm_s.get(&p), 1000.0, 1)),
        ));
        cols.push((
            format!("decode tok/s @{p}"),
            Box::new(move |e: &EngineResult| cell(e.decode_tps.get(&p), 1.0, 1)),
        ));
    }
    for &c in &report.protocol.concurrency {
        cols.push((
            format!("tok/s x{c}"),
            Box::new(move |e: &EngineResult| cell(e.aggregate_tps.get(&c), 1.0, 1)),
        ));
    }
    if speculated(report) {
        cols.push((
            "accepted %".into(),
            Box::new(|e: &EngineResult| {
                let rate = e
                    .speculation
                    .as_ref()
                    .and_then(|s| s.acceptance_rate.as_ref());
                cell(rate, 100.0, 1)
            }),
        ));
        cols.push((
            "tok/pass".into(),
            Box::new(|e: &EngineResult| {
                let per_pass = e
                    .speculation
                    .as_ref()
                    .and_then(|s| s.tokens_per_verification.as_ref());
                cell(per_pass, 1.0, 2)
            }),
        ));
        let estimated = |e: &EngineResult| {
            e.speculation
                .as_ref()
                .and_then(|s| s.time_saved_s.as_ref())
                .is_some()
        };
        if report.engines.iter().any(estimated) {
            cols.push((
                "saved s".into(),
                Box::new(|e: &EngineResult| {
                    let saved = e.speculation.as_ref().and_then(|s| s.time_saved_s.as_ref());
                    cell(saved, 1.0, 2)
                }),
            ));
        }
    }
    cols.push((
        "peak RSS MiB".into(),
        Box::new(|e: &EngineResult| cell(e.peak_rss_bytes.as_ref(), 1.0 / 1048576.0, 0)),
    ));
    if report.engines.iter().any(|e| e.peak_gpu_bytes.is_some()) {
        cols.push((
            "peak GPU MiB".into(),
            Box::new(|e: &EngineResult| cell(e.peak_gpu_bytes.as_ref(), 1.0 / 1048576.0, 0)),
        ));
    }
    cols
}

/// Whether any engine of the run speculated: only then does the table
/// show speculation's columns.
fn speculated(report: &Report) -> bool {
    report.engines.iter().any(|e| e.speculation.is_some())
}

/// The lines under either table: what was measured, and how.
fn footer(report: &Report) -> Vec<String> {
    let p = &report.protocol;
    let mut lines = vec![
        format!(
            "median (min–max) of {} interleaved round(s){}; {} tokens per answer, temperature {}, seed {}",
            p.rounds,
            if p.warmup { " after a warm-up" } else { ", no warm-up" },
            p.gen_tokens,
            p.temperature,
            p.seed
        ),
        format!(
            "hangar {} on {} ({}, {} CPUs, {} MiB); {} → {}",
            report.hangar_version,
            report.platform.platform,
            report.platform.cpu_model.as_deref().unwrap_or("unknown CPU"),
            report.platform.cpus,
            report.platform.memory_bytes.map_or("?".into(), |b| (b / 1048576).to_string()),
            report.started_at,
            report.ended_at
        ),
    ];
    if speculated(report) {
        lines.push(
            "accepted %: the proposed tokens the engine kept; tok/pass: the tokens each verifying pass gave \
             (the kept ones and the engine's own after them); per round over every measured answer, \
             where the engine speculated"
                .into(),
        );
    }
    for e in report.engines.iter().filter(|e| e.answers_short > 0) {
        lines.push(format!(
            "{} on {}: {} answer(s) ended before {} tokens (end of sequence); its rates cover fewer tokens",
            e.engine, e.model.id, e.answers_short, p.gen_tokens
        ));
    }
    if p.allow_different_files {
        lines.push(
            "different model files per engine were allowed (--allow-different-files):".into(),
        );
        for e in &report.engines {
            let files: Vec<String> = e
                .model
                .files
                .iter()
                .map(|f| {
                    format!(
                        "{} ({} B{})",
                        f.name,
                        f.size,
                        f.sha256.as_deref().map_or(String::new(), |h| format!(
                            ", {} sha256 {}",
                            f.hashed,
                            &h[..12]
                        ))
                    )
                })
                .collect();
            lines.push(format!(
                "  {} on {}: {}",
                e.engine,
                e.model.id,
                files.join(", ")
            ));
        }
    }
    lines
}

/// The table printed on stdout.
pub(crate) fn text_table(report: &Report) -> String {
    let cols = columns(report);
    let headers: Vec<&str> = cols.iter().map(|(h, _)| h.as_str()).collect();
    let mut t = table(&headers);
    for e in &report.engines {
        t.add_row(cols.iter().map(|(_, f)| f(e)).collect::<Vec<_>>());
    }
    let mut out = t.to_string();
    for line in footer(report) {
        out.push('\n');
        out.push_str(&line);
    }
    out
}

/// The Markdown document `--markdown` writes.
pub(crate) fn markdown(report: &Report) -> String {
    let cols = columns(report);
    let mut out = String::from("# hangar bench\n\n");
    out.push_str(&format!(
        "| {} |\n|{}\n",
        cols.iter()
            .map(|(h, _)| h.as_str())
            .collect::<Vec<_>>()
            .join(" | "),
        " --- |".repeat(cols.len())
    ));
    for e in &report.engines {
        let cells: Vec<String> = cols.iter().map(|(_, f)| f(e).replace('|', "\\|")).collect();
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    out.push('\n');
    for line in footer(report) {
        out.push_str(&format!("- {}\n", line.trim_start()));
    }
    out.push_str("\n## Provenance\n\n");
    for e in &report.engines {
        out.push_str(&format!(
            "- **{}** (plugin {}, engine {}) on `{}` ({}, `{}`); settings `{}`; prompt tokens the engine counted: {}; memory of the {}{}\n",
            e.engine,
            e.plugin_version,
            e.engine_version.as_deref().unwrap_or("unknown"),
            e.model.id,
            e.model.format,
            e.model.path,
            e.settings,
            if e.prompt_tokens_counted.is_empty() {
                "not reported".to_string()
            } else {
                e.prompt_tokens_counted
                    .iter()
                    .map(|(words, n)| format!("{n} for {words} words"))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            e.rss_of,
            e.speculation.as_ref().map_or(String::new(), |s| format!(
                "; speculation over all rounds: {} verifying passes, {} tokens proposed, {} kept",
                s.total.verifications, s.total.proposed_tokens, s.total.accepted_tokens
            ))
        ));
        for f in &e.model.files {
            out.push_str(&format!(
                "  - `{}` {} bytes, {} sha256 `{}`\n",
                f.name,
                f.size,
                f.hashed,
                f.sha256.as_deref().unwrap_or("-")
            ));
        }
    }
    let la = |l: Option<[f64; 3]>| l.map_or("?".into(), |l| format!("{} {} {}", l[0], l[1], l[2]));
    out.push_str(&format!(
        "- load average: {} at the start, {} at the end\n- prompts (seed {}): {}\n",
        la(report.load_average.start),
        la(report.load_average.end),
        report.protocol.seed,
        report
            .prompts
            .iter()
            .map(|p| format!(
                "{} ({} words, sha256 {})",
                p.purpose,
                p.words,
                &p.sha256[..12]
            ))
            .collect::<Vec<_>>()
            .join("; ")
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{engine, model, report, speculating};
    use super::*;
    use expect_test::expect;

    #[test]
    fn table_and_markdown() {
        let mut e = engine(
            "mlx-lm",
            model("tiny", "1111111111111111"),
            &[100.0, 120.0],
            &[0.0101, 0.0125],
        );
        e.answers_short = 1;
        let run = report(true, 16, vec![e]);
        expect![[r#"
             engine        model  load s            TTFT cold ms @8   TTFT warm ms @8  decode tok/s @8      tok/s x1  peak RSS MiB 
             mlx-lm 1.0.0  tiny   1.05 (1.00–1.10)  11.3 (10.1–12.5)  -                110.0 (100.0–120.0)  -         -            
            median (min–max) of 2 interleaved round(s) after a warm-up; 16 tokens per answer, temperature 0, seed 1
            hangar 0.1.0 on linux/x86_64/cpu (unknown CPU, 2 CPUs, ? MiB); t0 → t1
            mlx-lm on tiny: 1 answer(s) ended before 16 tokens (end of sequence); its rates cover fewer tokens"#]]
        .assert_eq(&text_table(&run));
        expect![[r#"
            # hangar bench

            | engine | model | load s | TTFT cold ms @8 | TTFT warm ms @8 | decode tok/s @8 | tok/s x1 | peak RSS MiB |
            | --- | --- | --- | --- | --- | --- | --- | --- |
            | mlx-lm 1.0.0 | tiny | 1.05 (1.00–1.10) | 11.3 (10.1–12.5) | - | 110.0 (100.0–120.0) | - | - |

            - median (min–max) of 2 interleaved round(s) after a warm-up; 16 tokens per answer, temperature 0, seed 1
            - hangar 0.1.0 on linux/x86_64/cpu (unknown CPU, 2 CPUs, ? MiB); t0 → t1
            - mlx-lm on tiny: 1 answer(s) ended before 16 tokens (end of sequence); its rates cover fewer tokens

            ## Provenance

            - **mlx-lm** (plugin 0.1.0, engine 1.0.0) on `tiny` (mlx, `/m/tiny`); settings `{}`; prompt tokens the engine counted: not reported; memory of the engine process tree
              - `config.json` 10 bytes, file sha256 `aaaaaaaaaaaaaaaa`
              - `model.safetensors` 99 bytes, header sha256 `1111111111111111`
            - load average: ? at the start, ? at the end
            - prompts (seed 1): 
        "#]]
        .assert_eq(&markdown(&run));
    }

    #[test]
    fn speculation_shows_where_an_engine_speculated() {
        let m = model("tiny", "1111111111111111");
        let spec = speculating(
            engine("native-mlx", m.clone(), &[200.0, 220.0], &[0.010, 0.012]),
            &[(10, 40, 25), (12, 48, 24)],
        );
        let plain = engine("mlx-lm", m, &[100.0, 120.0], &[0.0101, 0.0125]);
        let run = report(true, 16, vec![spec, plain]);
        expect![[r#"
             engine            model  load s            TTFT cold ms @8   TTFT warm ms @8  decode tok/s @8      tok/s x1  accepted %        tok/pass          peak RSS MiB 
             native-mlx 1.0.0  tiny   1.05 (1.00–1.10)  11.0 (10.0–12.0)  -                210.0 (200.0–220.0)  -         56.2 (50.0–62.5)  3.25 (3.00–3.50)  -            
             mlx-lm 1.0.0      tiny   1.05 (1.00–1.10)  11.3 (10.1–12.5)  -                110.0 (100.0–120.0)  -         -                 -                 -            
            median (min–max) of 2 interleaved round(s) after a warm-up; 16 tokens per answer, temperature 0, seed 1
            hangar 0.1.0 on linux/x86_64/cpu (unknown CPU, 2 CPUs, ? MiB); t0 → t1
            accepted %: the proposed tokens the engine kept; tok/pass: the tokens each verifying pass gave (the kept ones and the engine's own after them); per round over every measured answer, where the engine speculated"#]]
        .assert_eq(&text_table(&run));
        let md = markdown(&run);
        expect![[r#"
            | engine | model | load s | TTFT cold ms @8 | TTFT warm ms @8 | decode tok/s @8 | tok/s x1 | accepted % | tok/pass | peak RSS MiB |
            | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
            | native-mlx 1.0.0 | tiny | 1.05 (1.00–1.10) | 11.0 (10.0–12.0) | - | 210.0 (200.0–220.0) | - | 56.2 (50.0–62.5) | 3.25 (3.00–3.50) | - |
            | mlx-lm 1.0.0 | tiny | 1.05 (1.00–1.10) | 11.3 (10.1–12.5) | - | 110.0 (100.0–120.0) | - | - | - | - |
            - **native-mlx** (plugin 0.1.0, engine 1.0.0) on `tiny` (mlx, `/m/tiny`); settings `{}`; prompt tokens the engine counted: not reported; memory of the engine process tree; speculation over all rounds: 22 verifying passes, 88 tokens proposed, 49 kept
            - **mlx-lm** (plugin 0.1.0, engine 1.0.0) on `tiny` (mlx, `/m/tiny`); settings `{}`; prompt tokens the engine counted: not reported; memory of the engine process tree"#]]
        .assert_eq(
            &md.lines()
                .filter(|l| l.starts_with("| ") || l.starts_with("- **"))
                .collect::<Vec<_>>()
                .join("\n"),
        );
    }

    #[test]
    fn records_carry_speculation_and_older_records_still_read() {
        let m = model("tiny", "1111111111111111");
        let plain = engine("mlx-lm", m.clone(), &[100.0], &[0.01]);
        // A record of an engine that did not speculate, or one written
        // before speculation was measured, has no `speculation` at all.
        let old = serde_json::to_value(&plain).unwrap();
        assert_eq!(old.get("speculation"), None);
        let read: EngineResult = serde_json::from_value(old).unwrap();
        assert_eq!(read.speculation, None);
        // A round that proposed nothing has no rate; the totals count it.
        let spec = speculating(plain, &[(4, 8, 6), (2, 0, 0)]);
        let json = serde_json::to_value(&spec).unwrap();
        expect![[r#"
            {
              "verifications": 6,
              "proposed_tokens": 8,
              "accepted_tokens": 6,
              "acceptance_rate": {
                "median": 0.75,
                "min": 0.75,
                "max": 0.75,
                "samples": [
                  0.75
                ]
              },
              "tokens_per_verification": {
                "median": 1.75,
                "min": 1.0,
                "max": 2.5,
                "samples": [
                  2.5,
                  1.0
                ]
              }
            }"#]]
        .assert_eq(&serde_json::to_string_pretty(&spec.speculation).unwrap());
        let read: EngineResult = serde_json::from_value(json).unwrap();
        assert_eq!(read.speculation, spec.speculation);
    }
}
