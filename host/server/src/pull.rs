//! `hangar pull REPO[@REVISION]`: fetches a model from a Hugging Face-compatible
//! hub into the Hugging Face cache, where the catalog (and mlx-lm,
//! transformers and llama.cpp) find it.
//!
//! The hub's HTTP API is used directly: `GET {endpoint}/api/models/{repo}/revision/{rev}?blobs=true`
//! lists the files with their sizes and, for Git LFS files, their SHA-256;
//! each file comes from `{endpoint}/{repo}/resolve/{commit}/{path}` (which
//! may redirect to a CDN). `HF_ENDPOINT` names a mirror, `HF_TOKEN` is sent
//! as a bearer token for gated repositories.
//!
//! The cache layout is the Hugging Face one (`HF_HUB_CACHE`, else
//! `HF_HOME/hub`, else `~/.cache/huggingface/hub`):
//!
//! ```text
//! models--ORG--NAME/blobs/<sha256 or git blob id>
//! models--ORG--NAME/snapshots/<commit>/<path> -> ../../blobs/<blob>
//! models--ORG--NAME/refs/<revision>            (holds <commit>)
//! ```
//!
//! Why a pull is safe to kill at any point: a file downloads into
//! `blobs/<blob>.incomplete` and is renamed to its blob only once its size
//! (and, for LFS files, its SHA-256) is right; the next pull continues an
//! `.incomplete` file with a `Range` request. The SHA-256 of what arrived
//! is kept beside it (`blobs/<blob>.incomplete.sha256`, see [`sha256`]),
//! so that the next pull hashes what it fetches, not again what it has. The snapshot is built in a
//! hidden folder and renamed into place, and `refs/<revision>` written,
//! only after every file is complete, so the catalog never takes a partial
//! download for a model: before that, the repository folder holds no
//! snapshot, which the catalog reports as "the download did not finish".

use std::collections::BTreeMap;
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use clap::Args;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use crate::output::outln;
use crate::scheduler::guard::{bytes, ceiling, Guard};
use hangar_engine::models::{self, Rule};
use hangar_engine::registry::Registry;

mod sha256;

/// The hub used when `HF_ENDPOINT` is not set.
pub(crate) const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// The suffix of a blob that is still downloading.
const INCOMPLETE: &str = ".incomplete";

/// The most of a `config.json` fetched for the memory estimate.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Options of `hangar pull`.
#[derive(Debug, Args)]
pub struct PullArgs {
    /// The repository, `ORG/NAME` (or `NAME`), optionally `@REVISION` (a
    /// branch, tag or commit; default `main`).
    pub repo: String,
    /// Fetch only the files whose paths match this glob (`*.gguf`,
    /// `*Q4_K_M*`); repeatable. Default: every file.
    #[arg(long = "include", value_name = "GLOB")]
    pub include: Vec<String>,
    /// Download even what no installed plugin can serve, or what does not
    /// fit under the memory guard's ceiling.
    #[arg(long)]
    pub force: bool,
    /// The memory guard whose ceiling the model is compared with (as
    /// `hangar serve --memory-guard`).
    #[arg(long, default_value = "balanced")]
    pub memory_guard: Guard,
    /// Files downloaded at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub jobs: u16,
}

/// A repository and revision, as `ORG/NAME@REVISION` names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RepoRef {
    pub(crate) repo: String,
    pub(crate) revision: String,
}

impl RepoRef {
    /// Parses `ORG/NAME[@REVISION]`; the revision defaults to `main`.
    pub(crate) fn parse(text: &str) -> Result<RepoRef, String> {
        let (repo, revision) = match text.split_once('@') {
            Some((repo, revision)) => (repo, revision),
            None => (text, "main"),
        };
        let parts: Vec<&str> = repo.split('/').collect();
        let part_ok = |p: &&str| {
            !p.is_empty()
                && *p != "."
                && *p != ".."
                && !p.starts_with("--")
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        if parts.len() > 2 || !parts.iter().all(part_ok) {
            return Err(format!(
                "'{text}' is not a repository: use ORG/NAME or ORG/NAME@REVISION \
                 (letters, digits, '-', '_' and '.'; for example Qwen/Qwen3-0.6B@main)"
            ));
        }
        let revision_ok = !revision.is_empty()
            && !revision.starts_with('/')
            && !revision.ends_with('/')
            && revision
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != "..")
            && !revision.contains(['\\', '@', ' ']);
        if !revision_ok {
            return Err(format!(
                "'{revision}' (in '{text}') is not a revision: use a branch, tag or commit \
                 hash such as main, v1.0 or refs/pr/1"
            ));
        }
        Ok(RepoRef {
            repo: repo.to_string(),
            revision: revision.to_string(),
        })
    }

    /// The repository's folder in the cache: `models--ORG--NAME`.
    pub(crate) fn folder_name(&self) -> String {
        RepoRef::folder_name_of(&self.repo)
    }

    /// The cache folder of repository `repo` (`ORG/NAME`).
    pub(crate) fn folder_name_of(repo: &str) -> String {
        format!("models--{}", repo.replace('/', "--"))
    }
}

/// The `--include` globs; no glob selects every file. A glob matches the
/// file's whole path inside the repository, and `*` crosses `/` (as the
/// hub client's `allow_patterns` do), so `*.gguf` also picks `q4/m.gguf`.
#[derive(Debug)]
pub(crate) struct Include(Option<globset::GlobSet>);

impl Include {
    pub(crate) fn new(globs: &[String]) -> Result<Include, String> {
        if globs.is_empty() {
            return Ok(Include(None));
        }
        let mut set = globset::GlobSetBuilder::new();
        for glob in globs {
            set.add(
                globset::Glob::new(glob)
                    .map_err(|e| format!("--include '{glob}' is not a glob: {e}"))?,
            );
        }
        set.build()
            .map(|s| Include(Some(s)))
            .map_err(|e| format!("--include globs do not build: {e}"))
    }

    pub(crate) fn matches(&self, path: &str) -> bool {
        self.0.as_ref().is_none_or(|s| s.is_match(path))
    }
}

/// The symlink target of snapshot file `path` (a path inside the
/// repository) for blob `blob`: relative, so that the cache can move.
pub(crate) fn link_target(path: &str, blob: &str) -> PathBuf {
    let depth = path.matches('/').count();
    let mut target = PathBuf::from("../..");
    for _ in 0..depth {
        target.push("..");
    }
    target.join("blobs").join(blob)
}

/// Whether a file path from the hub stays inside the snapshot folder.
fn safe_path(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && !path.contains('\\')
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

/// Percent-encodes a URL path segment list: `/` is kept when `keep_slash`.
pub(crate) fn encode(text: &str, keep_slash: bool) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b'/' if keep_slash => out.push('/'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

// ---------------------------------------------------------------------------
// the hub's answers

#[derive(Debug, Deserialize)]
struct ModelInfo {
    sha: Option<String>,
    #[serde(default)]
    siblings: Vec<Sibling>,
}

#[derive(Debug, Deserialize)]
struct Sibling {
    rfilename: String,
    size: Option<u64>,
    #[serde(rename = "blobId")]
    blob_id: Option<String>,
    lfs: Option<Lfs>,
}

#[derive(Debug, Deserialize)]
struct Lfs {
    sha256: String,
    size: Option<u64>,
}

/// One file to fetch.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct File {
    pub(crate) path: String,
    pub(crate) size: u64,
    /// The blob's name in the cache: the LFS SHA-256, else the git blob id.
    pub(crate) blob: String,
    /// The SHA-256 the file must have (LFS files).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) sha256: Option<String>,
}

fn is_hex(s: &str) -> bool {
    !s.is_empty() && s.len() <= 128 && s.chars().all(|c| c.is_ascii_hexdigit())
}

impl File {
    fn from_sibling(s: Sibling) -> anyhow::Result<File> {
        let name = &s.rfilename;
        if !safe_path(name) {
            bail!("the hub lists a file '{name}' whose path leaves the repository; refusing it");
        }
        let (blob, sha256, size) = match s.lfs {
            Some(lfs) => {
                let sha = lfs.sha256.to_ascii_lowercase();
                if sha.len() != 64 || !is_hex(&sha) {
                    bail!("the hub gives file '{name}' the SHA-256 '{sha}', which is not one");
                }
                (sha.clone(), Some(sha), lfs.size.or(s.size))
            }
            None => {
                let id = s.blob_id.ok_or_else(|| {
                    anyhow!("the hub gives no blob id for file '{name}'; it does not answer ?blobs=true as the Hugging Face hub does")
                })?;
                if !is_hex(&id) {
                    bail!("the hub gives file '{name}' the blob id '{id}', which is not a hash");
                }
                (id.to_ascii_lowercase(), None, s.size)
            }
        };
        let size = size.ok_or_else(|| {
            anyhow!("the hub gives no size for file '{name}'; it does not answer ?blobs=true as the Hugging Face hub does")
        })?;
        Ok(File {
            path: s.rfilename,
            size,
            blob,
            sha256,
        })
    }
}

// ---------------------------------------------------------------------------
// events

/// What a pull reports as it goes: `--json` prints one per line, the server
/// keeps them for a pull's status and event stream.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub(crate) enum Event<'a> {
    Plan(&'a Plan),
    Progress {
        bytes: u64,
        total: u64,
        /// Bytes fetched per second since the pull started.
        bytes_per_second: u64,
    },
    File {
        path: &'a str,
        size: u64,
        fetched: u64,
    },
    Done {
        path: &'a Path,
        commit: &'a str,
        fetched: u64,
    },
    Error {
        message: String,
    },
}

/// Where a pull's progress goes: the CLI's bar, plain lines or JSON, or
/// the server's record of the pull.
pub(crate) trait Sink: Send + Sync {
    /// `n` more bytes arrived; called for every chunk, so it must be cheap.
    fn added(&self, _n: u64) {}
    /// Something worth reporting happened.
    fn event(&self, event: &Event<'_>);
}

/// What the pull will do, before it does it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Plan {
    pub(crate) repo: String,
    pub(crate) revision: String,
    pub(crate) commit: String,
    pub(crate) endpoint: String,
    pub(crate) files: Vec<File>,
    pub(crate) total_bytes: u64,
    /// Bytes not yet in the cache.
    pub(crate) to_fetch: u64,
    pub(crate) format: Option<String>,
    pub(crate) rule: Option<String>,
    pub(crate) engine: Option<String>,
    /// Why the engine was chosen, or why none can serve it.
    pub(crate) reason: String,
    /// The memory estimate (weights + KV cache for the default context).
    pub(crate) need_bytes: u64,
    pub(crate) ceiling_bytes: Option<u64>,
    pub(crate) fits: Option<bool>,
    pub(crate) cache: PathBuf,
}

/// Why a pull cannot start: typed, so that the CLI prints the message and
/// the API answers the status that fits.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub(crate) struct Refusal {
    pub(crate) kind: RefusalKind,
    pub(crate) message: String,
}

/// What kind of [`Refusal`] it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RefusalKind {
    /// A field of the request is wrong: the field's name (`repo`,
    /// `revision`, `include`).
    BadInput(&'static str),
    /// The hub wants a token, or one that may read the repository (its
    /// 401).
    Unauthorized,
    /// The hub refused the token (its 403).
    Forbidden,
    /// No such repository or revision on the hub.
    NotFound,
    /// No installed plugin serves it.
    Unservable,
    /// It does not fit under the memory guard's ceiling.
    TooBig,
    /// The cache's disk has not enough free space.
    NoDisk,
    /// The hub cannot be reached, or answered what a hub does not.
    Hub,
    /// The host itself failed (no cache folder, no HTTP client).
    Host,
}

impl Refusal {
    fn new(kind: RefusalKind, message: impl Into<String>) -> Refusal {
        Refusal {
            kind,
            message: message.into(),
        }
    }
}

/// How progress is shown: a bar on a terminal, plain lines otherwise, or
/// JSON events.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Bar,
    Plain,
    Json,
}

fn emit(event: &Event<'_>) -> std::io::Result<()> {
    outln!(
        "{}",
        serde_json::to_string(event).expect("events serialize")
    )
}

// ---------------------------------------------------------------------------
// the pull

/// Runs `hangar pull`.
pub(crate) fn run(
    args: PullArgs,
    registry: &Registry,
    default_engines: &BTreeMap<String, String>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let mode = if json {
        Mode::Json
    } else if std::io::stderr().is_terminal() {
        Mode::Bar
    } else {
        Mode::Plain
    };
    let runtime = tokio::runtime::Runtime::new().context("cannot start the pull's runtime")?;
    let result = runtime.block_on(pull(&args, registry, default_engines, mode));
    match result {
        Ok(code) => Ok(code),
        Err(e) if mode == Mode::Json => {
            emit(&Event::Error {
                message: format!("{e:#}"),
            })?;
            Err(e)
        }
        Err(e) => Err(e),
    }
}

/// A Hugging Face-compatible hub, as `HF_ENDPOINT` and `HF_TOKEN` name it.
pub(crate) struct Hub {
    client: reqwest::Client,
    pub(crate) endpoint: String,
    token: Option<String>,
}

impl Hub {
    /// The hub `HF_ENDPOINT` names (default [`DEFAULT_ENDPOINT`]), with
    /// `HF_TOKEN` as its bearer token.
    pub(crate) fn from_env() -> Result<Hub, Refusal> {
        let env = |k: &str| std::env::var(k).ok();
        let endpoint = env("HF_ENDPOINT")
            .filter(|e| !e.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_ENDPOINT.into())
            .trim_end_matches('/')
            .to_string();
        if !endpoint.starts_with("http://") && !endpoint.starts_with("https://") {
            return Err(Refusal::new(
                RefusalKind::Host,
                format!("HF_ENDPOINT '{endpoint}' is not an http:// or https:// URL"),
            ));
        }
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(30))
            .read_timeout(Duration::from_secs(60))
            .user_agent(concat!("hangar/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| {
                Refusal::new(
                    RefusalKind::Host,
                    format!("cannot build the HTTP client: {e}"),
                )
            })?;
        Ok(Hub {
            client,
            endpoint,
            token: env("HF_TOKEN").filter(|t| !t.is_empty()),
        })
    }

    pub(crate) fn get(&self, url: &str) -> reqwest::RequestBuilder {
        let request = self.client.get(url);
        match &self.token {
            Some(t) => request.bearer_auth(t),
            None => request,
        }
    }

    /// Why the hub refused `what`, for statuses a user can act on.
    pub(crate) fn refusal(&self, status: reqwest::StatusCode, repo: &str, what: &str) -> Refusal {
        let auth = if status == reqwest::StatusCode::FORBIDDEN {
            RefusalKind::Forbidden
        } else {
            RefusalKind::Unauthorized
        };
        let (kind, message) = match status.as_u16() {
            401 | 403 if self.token.is_none() => (
                auth,
                format!(
                    "{} answered {status} for {what}: repository {repo} is gated or private; \
                     set HF_TOKEN to an access token that may read it (and accept its terms on the hub)",
                    self.endpoint
                ),
            ),
            401 | 403 => (
                auth,
                format!(
                    "{} answered {status} for {what}: the token in HF_TOKEN may not read repository {repo}; \
                     accept the repository's terms on the hub or use a token with access",
                    self.endpoint
                ),
            ),
            404 => (
                RefusalKind::NotFound,
                format!(
                    "{} answered 404 for {what}: no repository {repo} at that revision (check the name, \
                     the revision and HF_ENDPOINT)",
                    self.endpoint
                ),
            ),
            _ => (
                RefusalKind::Hub,
                format!("{} answered {status} for {what}", self.endpoint),
            ),
        };
        Refusal::new(kind, message)
    }

    /// `url`'s JSON, or the refusal that says why not.
    pub(crate) async fn json<T: serde::de::DeserializeOwned>(
        &self,
        url: &str,
        repo: &str,
        what: &str,
    ) -> Result<T, Refusal> {
        let response = self.get(url).send().await.map_err(|e| {
            Refusal::new(
                RefusalKind::Hub,
                format!(
                    "cannot reach the hub at {} (set HF_ENDPOINT for a mirror): {e}",
                    self.endpoint
                ),
            )
        })?;
        if !response.status().is_success() {
            return Err(self.refusal(response.status(), repo, what));
        }
        response.json().await.map_err(|e| {
            Refusal::new(
                RefusalKind::Hub,
                format!("{url} did not answer {what} as a hub does: {e}"),
            )
        })
    }
}

/// The cache `hangar pull` fills: [`crate::model_store::hf_cache`], where
/// `hangar serve` reads it too.
pub(crate) fn default_cache() -> Result<PathBuf, Refusal> {
    crate::model_store::hf_cache().ok_or_else(|| {
        Refusal::new(
            RefusalKind::Host,
            "no Hugging Face cache: set HF_HUB_CACHE or HF_HOME (there is no home folder)",
        )
    })
}

/// What a pull is asked to fetch, and against which memory ceiling.
pub(crate) struct Wanted<'a> {
    pub(crate) target: &'a RepoRef,
    pub(crate) include: &'a [String],
    pub(crate) guard: Guard,
    /// The memory guard's byte limit, when one was set.
    pub(crate) memory_limit: Option<u64>,
}

/// Asks the hub what `wanted` holds and works out what Hangar makes of it;
/// nothing is written.
pub(crate) async fn plan(
    hub: &Hub,
    cache: &Path,
    wanted: &Wanted<'_>,
    registry: &Registry,
    default_engines: &BTreeMap<String, String>,
) -> Result<Plan, Refusal> {
    let target = wanted.target;
    let include = Include::new(wanted.include)
        .map_err(|e| Refusal::new(RefusalKind::BadInput("include"), e))?;
    let info_url = format!(
        "{}/api/models/{}/revision/{}?blobs=true",
        hub.endpoint,
        encode(&target.repo, true),
        encode(&target.revision, false)
    );
    let info: ModelInfo = hub
        .json(
            &info_url,
            &target.repo,
            &format!("the model info of {}@{}", target.repo, target.revision),
        )
        .await?;
    let bad_hub = |message: String| Refusal::new(RefusalKind::Hub, message);
    let commit = info.sha.filter(|c| is_hex(c)).ok_or_else(|| {
        bad_hub(format!(
            "{info_url} gives no commit hash (`sha`) for the revision"
        ))
    })?;
    let all: Vec<File> = info
        .siblings
        .into_iter()
        .map(File::from_sibling)
        .collect::<anyhow::Result<_>>()
        .map_err(|e| bad_hub(format!("{e:#}")))?;
    let files: Vec<File> = all
        .iter()
        .filter(|f| include.matches(&f.path))
        .cloned()
        .collect();
    if files.is_empty() {
        let names: Vec<&str> = all.iter().map(|f| f.path.as_str()).collect();
        return Err(Refusal::new(
            RefusalKind::BadInput("include"),
            format!(
                "no file of {} matches --include {}; its files are: {}",
                target.repo,
                wanted.include.join(" "),
                if names.is_empty() {
                    "none".into()
                } else {
                    names.join(", ")
                }
            ),
        ));
    }

    // What Hangar makes of it.
    let names: Vec<String> = files
        .iter()
        .filter(|f| !f.path.contains('/'))
        .map(|f| f.path.clone())
        .collect();
    let recognised = models::rule_for_names(&names, registry.rules());
    let weights: u64 = match &recognised {
        Some((_, weights)) => files
            .iter()
            .filter(|f| weights.contains(&f.path))
            .map(|f| f.size)
            .sum(),
        None => 0,
    };
    let (format, rule, engine, reason) = match &recognised {
        Some((rule, _)) => {
            let resolution = registry.resolve(&rule.spec.format, default_engines);
            (
                Some(rule.spec.format.clone()),
                Some(Rule::describe(rule)),
                resolution.chosen.clone(),
                resolution.reason.clone(),
            )
        }
        None => (
            None,
            None,
            None,
            format!(
                "no recognition rule matches its files (tried {})",
                registry
                    .rules()
                    .iter()
                    .filter(|r| !r.spec.folder.is_empty())
                    .map(Rule::describe)
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        ),
    };
    let blobs = cache.join(target.folder_name()).join("blobs");
    let config = match files.iter().find(|f| f.path == "config.json") {
        Some(f) if recognised.is_some() && f.size <= MAX_CONFIG_BYTES => {
            // The cached copy when there is one: a pull of what is already
            // here fetches nothing.
            match std::fs::read(blobs.join(&f.blob)) {
                Ok(text) if text.len() as u64 == f.size => serde_json::from_slice(&text).ok(),
                _ => fetch_small(hub, &target.repo, &commit, &f.path).await,
            }
        }
        _ => None,
    };
    let need = crate::scheduler::estimate::from_config(config.as_ref(), weights, None).total();
    let ceiling = ceiling(
        wanted.guard,
        wanted.memory_limit,
        crate::scheduler::readings::machine(false),
        0,
    );
    let to_fetch = files.iter().map(|f| missing_bytes(&blobs, f)).sum();
    Ok(Plan {
        repo: target.repo.clone(),
        revision: target.revision.clone(),
        commit,
        endpoint: hub.endpoint.clone(),
        total_bytes: files.iter().map(|f| f.size).sum(),
        to_fetch,
        files,
        format,
        rule,
        engine,
        reason,
        need_bytes: need,
        ceiling_bytes: ceiling,
        fits: ceiling.map(|c| need <= c),
        cache: cache.to_path_buf(),
    })
}

impl Plan {
    /// Why this pull may not start unless forced, for `hangar pull` and
    /// `POST /api/models/pull` alike: no installed plugin serves it, or it
    /// does not fit under the `guard` memory guard's ceiling. `force` says
    /// how to pull it anyway (`--force`, `"force": true`).
    pub(crate) fn refusal(&self, guard: Guard, force: &str) -> Option<Refusal> {
        self.unservable(force)
            .or_else(|| self.too_big(guard, force))
    }

    /// The refusal of a repository no installed plugin serves; `force`
    /// says how to pull it anyway.
    fn unservable(&self, force: &str) -> Option<Refusal> {
        self.engine.is_none().then(|| {
            Refusal::new(
                RefusalKind::Unservable,
                format!(
                    "refusing to pull {}: no installed plugin can serve it ({}); pass {force} to download it anyway",
                    self.repo, self.reason
                ),
            )
        })
    }

    /// The refusal of a model that does not fit under the memory guard's
    /// ceiling; `force` says how to pull it anyway.
    fn too_big(&self, guard: Guard, force: &str) -> Option<Refusal> {
        let ceiling = self.ceiling_bytes.filter(|c| self.need_bytes > *c)?;
        Some(Refusal::new(
            RefusalKind::TooBig,
            format!(
                "refusing to pull {}: it needs about {} of memory, more than the {guard} memory guard's \
                 ceiling of {}; pass {force} to download it anyway",
                self.repo,
                bytes(self.need_bytes),
                bytes(ceiling)
            ),
        ))
    }

    /// Whether the cache's disk has room for what is still to fetch.
    pub(crate) fn check_disk(&self) -> Result<(), Refusal> {
        let free = free_space(&self.cache)
            .map_err(|e| Refusal::new(RefusalKind::Host, format!("{e:#}")))?;
        if self.to_fetch > free.1 {
            return Err(Refusal::new(
                RefusalKind::NoDisk,
                format!(
                    "not enough disk space to pull {}: it needs {} ({} bytes) more, and {} has {} ({} bytes) free; \
                     free some space or set HF_HUB_CACHE to a folder on a larger disk",
                    self.repo,
                    bytes(self.to_fetch),
                    self.to_fetch,
                    free.0.display(),
                    bytes(free.1),
                    free.1
                ),
            ));
        }
        Ok(())
    }
}

/// What a finished pull made.
pub(crate) struct Pulled {
    /// The snapshot folder: the model.
    pub(crate) snapshot: PathBuf,
    /// The bytes this pull fetched (the rest was in the cache).
    pub(crate) fetched: u64,
}

/// Fetches the files of `plan`, `jobs` at a time, reporting to `sink`, and
/// publishes the snapshot once every file is complete. Safe to drop at any
/// await: what arrived stays in `.incomplete` files for the next pull.
pub(crate) async fn execute(
    hub: &Hub,
    plan: &Plan,
    jobs: usize,
    sink: &dyn Sink,
) -> anyhow::Result<Pulled> {
    let repo_dir = plan.cache.join(RepoRef::folder_name_of(&plan.repo));
    let blobs = repo_dir.join("blobs");
    std::fs::create_dir_all(&blobs)
        .with_context(|| format!("cannot create {}", blobs.display()))?;
    let progress = Progress {
        sink,
        done: AtomicU64::new(plan.total_bytes - plan.to_fetch),
        already: plan.total_bytes - plan.to_fetch,
        total: plan.total_bytes,
        started: Instant::now(),
    };
    let fetched = AtomicU64::new(0);
    // A failed file does not stop the others: what they fetch is kept for
    // the next pull either way, and finishing them leaves less to resume.
    let failures = std::sync::Mutex::new(Vec::new());
    let files = futures_util::stream::iter(&plan.files).for_each_concurrent(jobs, |file| {
        let (progress, fetched, failures, blobs) = (&progress, &fetched, &failures, &blobs);
        async move {
            match fetch(hub, &plan.repo, &plan.commit, blobs, file, progress).await {
                Ok(got) => {
                    fetched.fetch_add(got, Ordering::Relaxed);
                    sink.event(&Event::File {
                        path: &file.path,
                        size: file.size,
                        fetched: got,
                    });
                }
                Err(e) => failures.lock().expect("no panics hold it").push(e),
            }
        }
    });
    // Progress every second while the files arrive.
    let ticks = async {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        loop {
            tick.tick().await;
            progress.report();
        }
    };
    tokio::select! {
        () = files => {}
        () = ticks => unreachable!("the ticker never ends"),
    }
    let mut failures = failures.into_inner().expect("no panics hold it");
    if let Some(first) = failures.pop() {
        let others: Vec<String> = failures.iter().map(|e| format!("{e:#}")).collect();
        return Err(if others.is_empty() {
            first
        } else {
            first.context(format!(
                "{} other file(s) failed too: {}",
                others.len(),
                others.join("; ")
            ))
        });
    }
    progress.report();

    // Only now is it a model.
    let snapshot = publish(&repo_dir, &plan.commit, &plan.revision, &plan.files)?;
    let fetched = fetched.load(Ordering::Relaxed);
    sink.event(&Event::Done {
        path: &snapshot,
        commit: &plan.commit,
        fetched,
    });
    Ok(Pulled { snapshot, fetched })
}

async fn pull(
    args: &PullArgs,
    registry: &Registry,
    default_engines: &BTreeMap<String, String>,
    mode: Mode,
) -> anyhow::Result<ExitCode> {
    let target = RepoRef::parse(&args.repo).map_err(anyhow::Error::msg)?;
    let cache = default_cache()?;
    let hub = Hub::from_env()?;
    let wanted = Wanted {
        target: &target,
        include: &args.include,
        guard: args.memory_guard,
        memory_limit: None,
    };
    let plan = plan(&hub, &cache, &wanted, registry, default_engines).await?;
    show_plan(&plan, args.memory_guard, mode)?;
    if let Some(refusal) = plan
        .refusal(args.memory_guard, "--force")
        .filter(|_| !args.force)
    {
        return Err(refusal.into());
    }
    // Room for it, before anything is written.
    plan.check_disk()?;
    let sink = Cli::new(mode, &plan);
    let pulled = execute(&hub, &plan, usize::from(args.jobs), &sink).await;
    sink.finish();
    let pulled = pulled?;
    if mode != Mode::Json {
        outln!(
            "pulled {}@{} ({}) into {} ({} fetched)",
            plan.repo,
            plan.revision,
            plan.commit,
            pulled.snapshot.display(),
            bytes(pulled.fetched)
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

fn show_plan(plan: &Plan, guard: Guard, mode: Mode) -> std::io::Result<()> {
    if mode == Mode::Json {
        return emit(&Event::Plan(plan));
    }
    outln!(
        "{}@{} (commit {}) from {}: {} file(s), {}{}",
        plan.repo,
        plan.revision,
        plan.commit,
        plan.endpoint,
        plan.files.len(),
        bytes(plan.total_bytes),
        if plan.to_fetch < plan.total_bytes {
            format!(" ({} still to fetch)", bytes(plan.to_fetch))
        } else {
            String::new()
        }
    )?;
    match (&plan.format, &plan.engine) {
        (Some(format), Some(engine)) => outln!(
            "format {format} (rule {}); served by {engine} ({})",
            plan.rule.as_deref().unwrap_or_default(),
            plan.reason
        )?,
        (Some(format), None) => outln!(
            "format {format} (rule {}); no installed plugin serves it: {}",
            plan.rule.as_deref().unwrap_or_default(),
            plan.reason
        )?,
        (None, _) => outln!("not a model Hangar recognises: {}", plan.reason)?,
    }
    if plan.format.is_some() {
        match plan.ceiling_bytes {
            Some(c) => outln!(
                "needs about {} of memory: {} the {guard} memory guard's ceiling of {}",
                bytes(plan.need_bytes),
                if plan.need_bytes <= c {
                    "fits under"
                } else {
                    "does NOT fit under"
                },
                bytes(c)
            )?,
            None => outln!(
                "needs about {} of memory (memory guard {guard}: no ceiling)",
                bytes(plan.need_bytes)
            )?,
        }
    }
    Ok(())
}

/// A small file's JSON, for the memory estimate; `None` on any failure
/// (the estimate then counts the weights only).
async fn fetch_small(hub: &Hub, repo: &str, commit: &str, path: &str) -> Option<serde_json::Value> {
    let url = resolve_url(&hub.endpoint, repo, commit, path);
    let response = hub.get(&url).send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    let body = response.bytes().await.ok()?;
    if body.len() as u64 > MAX_CONFIG_BYTES {
        return None;
    }
    serde_json::from_slice(&body).ok()
}

fn resolve_url(endpoint: &str, repo: &str, commit: &str, path: &str) -> String {
    format!(
        "{endpoint}/{}/resolve/{}/{}",
        encode(repo, true),
        encode(commit, false),
        encode(path, true)
    )
}

/// Bytes of `file` not yet in `blobs` (a complete blob, or part of an
/// `.incomplete` one).
fn missing_bytes(blobs: &Path, file: &File) -> u64 {
    let len = |p: PathBuf| std::fs::metadata(p).map(|m| m.len()).ok();
    if len(blobs.join(&file.blob)) == Some(file.size) {
        return 0;
    }
    let partial = len(blobs.join(format!("{}{INCOMPLETE}", file.blob))).unwrap_or(0);
    file.size.saturating_sub(partial.min(file.size))
}

/// The nearest existing folder at or above `dir`, and its free bytes.
fn free_space(dir: &Path) -> anyhow::Result<(PathBuf, u64)> {
    let mut at = dir.to_path_buf();
    while !at.exists() {
        match at.parent() {
            Some(p) if !p.as_os_str().is_empty() => at = p.to_path_buf(),
            _ => break,
        }
    }
    let stat = nix::sys::statvfs::statvfs(&at)
        .with_context(|| format!("cannot read the free space of {}", at.display()))?;
    #[allow(clippy::useless_conversion)] // the field types differ between platforms
    let free = u64::from(stat.blocks_available()).saturating_mul(u64::from(stat.fragment_size()));
    Ok((at, free))
}

/// Fetches one file into `blobs/<blob>`, continuing an `.incomplete` one;
/// returns the bytes it fetched.
async fn fetch(
    hub: &Hub,
    repo: &str,
    commit: &str,
    blobs: &Path,
    file: &File,
    progress: &Progress<'_>,
) -> anyhow::Result<u64> {
    let done = blobs.join(&file.blob);
    if std::fs::metadata(&done).is_ok_and(|m| m.len() == file.size) {
        return Ok(0);
    }
    let partial_path = blobs.join(format!("{}{INCOMPLETE}", file.blob));
    let mut hashing = Hashing::new(file, &partial_path);
    let mut have = std::fs::metadata(&partial_path).map_or(0, |m| m.len());
    if have > file.size {
        // Longer than the file: not a prefix of it.
        std::fs::remove_file(&partial_path).ok();
        hashing.restart();
        have = 0;
    }
    let url = resolve_url(&hub.endpoint, repo, commit, &file.path);
    let mut fetched = 0;
    if have < file.size || file.size == 0 {
        let mut request = hub.get(&url);
        if have > 0 {
            request = request.header(reqwest::header::RANGE, format!("bytes={have}-"));
        }
        let mut response = request
            .send()
            .await
            .with_context(|| format!("cannot fetch {} from {url}", file.path))?;
        let status = response.status();
        if status == reqwest::StatusCode::RANGE_NOT_SATISFIABLE {
            // The partial may be whole already; checked below.
        } else if !status.is_success() {
            return Err(hub
                .refusal(status, repo, &format!("file {}", file.path))
                .into());
        } else {
            if status != reqwest::StatusCode::PARTIAL_CONTENT && have > 0 {
                // The server ignored the range: start over.
                have = 0;
            }
            let mut out = std::fs::OpenOptions::new()
                .create(true)
                .append(have > 0)
                .write(true)
                .truncate(have == 0)
                .open(&partial_path)
                .with_context(|| format!("cannot write {}", partial_path.display()))?;
            if have == 0 {
                hashing.restart();
            } else {
                hashing.catch_up(&partial_path, have).await?;
            }
            // Unbuffered: what arrived is on disk, so a killed pull resumes
            // after it.
            let writer = &mut out;
            loop {
                let chunk = match response.chunk().await {
                    Ok(Some(chunk)) => chunk,
                    Ok(None) => break,
                    Err(e) => {
                        return Err(anyhow!(
                            "the download of {} broke off after {} of {} bytes ({e}); the part \
                             fetched is kept: run the same `hangar pull` again to continue it",
                            file.path,
                            have + fetched,
                            file.size
                        ));
                    }
                };
                if have + fetched + chunk.len() as u64 > file.size {
                    std::fs::remove_file(&partial_path).ok();
                    hashing.restart();
                    bail!(
                        "{} is longer than the {} bytes the hub lists for it; the partial download was \
                         deleted; check HF_ENDPOINT's mirror",
                        file.path,
                        file.size
                    );
                }
                writer
                    .write_all(&chunk)
                    .with_context(|| format!("cannot write {}", partial_path.display()))?;
                // Hashed once written, so that a checkpoint never covers
                // more than the file holds.
                hashing.update(&chunk);
                fetched += chunk.len() as u64;
                progress.add(chunk.len() as u64);
            }
        }
    }
    let len = std::fs::metadata(&partial_path).map_or(0, |m| m.len());
    if len != file.size {
        if len > file.size {
            std::fs::remove_file(&partial_path).ok();
            hashing.restart();
        }
        bail!(
            "{} is {len} bytes, but the hub lists {} bytes for it; run `hangar pull` again to continue it",
            file.path,
            file.size
        );
    }
    if let Some(want) = &file.sha256 {
        // Nothing, or not all of it, arrived now (it was there already).
        hashing.catch_up(&partial_path, len).await?;
        let got = hex(&hashing.finish().unwrap_or_default());
        if &got != want {
            std::fs::remove_file(&partial_path).ok();
            bail!(
                "{} failed its checksum: SHA-256 {got}, but the hub lists {want}; the download was \
                 deleted; pull again (if it fails again, the hub or mirror serves a corrupt file)",
                file.path
            );
        }
    }
    std::fs::rename(&partial_path, &done)
        .with_context(|| format!("cannot move {} into place", partial_path.display()))?;
    Ok(fetched)
}

/// Bytes hashed between two checkpoints of a partial download: at most
/// what a pull killed outright (no chance to checkpoint) makes the next
/// one hash again, per file.
const CHECKPOINT_EVERY: u64 = 64 << 20;

/// The suffix (after the partial file's name) of its SHA-256 checkpoint.
const CHECKPOINT: &str = ".sha256";

/// The SHA-256 of a partial download, for the files that have one to meet
/// (Git LFS files), kept beside it ([`sha256`]) every [`CHECKPOINT_EVERY`]
/// bytes and whenever the download stops short (an error, or a cancelled
/// pull dropping it), so that a resumed pull hashes what it fetches and
/// not again what it has.
struct Hashing {
    /// `None` for a file without a checksum, or while [`Hashing::catch_up`]
    /// has it on a blocking thread.
    hasher: Option<sha256::Sha256>,
    /// The checkpoint file.
    path: PathBuf,
    /// The bytes the checkpoint on disk covers.
    saved: u64,
}

impl Hashing {
    fn new(file: &File, partial: &Path) -> Hashing {
        let mut path = partial.as_os_str().to_owned();
        path.push(CHECKPOINT);
        Hashing {
            hasher: file.sha256.is_some().then(sha256::Sha256::default),
            path: PathBuf::from(path),
            saved: 0,
        }
    }

    fn update(&mut self, bytes: &[u8]) {
        if let Some(hasher) = &mut self.hasher {
            hasher.update(bytes);
            if hasher.len() - self.saved >= CHECKPOINT_EVERY {
                self.save();
            }
        }
    }

    /// Starts again from nothing: the partial file is new or gone.
    fn restart(&mut self) {
        if let Some(hasher) = &mut self.hasher {
            *hasher = sha256::Sha256::default();
        }
        std::fs::remove_file(&self.path).ok();
        self.saved = 0;
    }

    /// Brings the hash up to the first `upto` bytes of `partial`, reading
    /// (off the async threads) only what neither this pull nor the last
    /// one's checkpoint hashed.
    async fn catch_up(&mut self, partial: &Path, upto: u64) -> anyhow::Result<()> {
        let Some(mut hasher) = self.hasher.take() else {
            return Ok(());
        };
        if hasher.len() == 0 {
            let kept = std::fs::read(&self.path)
                .ok()
                .and_then(|bytes| sha256::Sha256::from_checkpoint(&bytes))
                .filter(|kept| kept.len() <= upto);
            if let Some(kept) = kept {
                self.saved = kept.len();
                hasher = kept;
            }
        }
        if hasher.len() > upto {
            hasher = sha256::Sha256::default();
        }
        if hasher.len() < upto {
            hasher = hash_range(partial, hasher, upto).await?;
        }
        self.hasher = Some(hasher);
        Ok(())
    }

    /// Writes the checkpoint (a new file renamed over the old, so that a
    /// kill leaves one whole); a failure costs only time on the next pull.
    fn save(&mut self) {
        let Some(hasher) = &self.hasher else {
            return;
        };
        let mut tmp = self.path.as_os_str().to_owned();
        tmp.push(".new");
        let written = std::fs::write(&tmp, hasher.checkpoint())
            .and_then(|()| std::fs::rename(&tmp, &self.path));
        match written {
            Ok(()) => self.saved = hasher.len(),
            Err(e) => {
                tracing::debug!(path = %self.path.display(), "cannot keep the SHA-256 checkpoint: {e}")
            }
        }
    }

    /// The digest, and the checkpoint gone: the file is whole (or about to
    /// be deleted).
    fn finish(mut self) -> Option<[u8; 32]> {
        std::fs::remove_file(&self.path).ok();
        self.hasher.take().map(sha256::Sha256::finalize)
    }
}

impl Drop for Hashing {
    fn drop(&mut self) {
        if self.hasher.as_ref().is_some_and(|h| h.len() > self.saved) {
            self.save();
        }
    }
}

/// `hasher` fed with `path` from where it stopped up to byte `upto`, read
/// off the async threads (a resumed file may be gigabytes).
async fn hash_range(
    path: &Path,
    mut hasher: sha256::Sha256,
    upto: u64,
) -> anyhow::Result<sha256::Sha256> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        use std::io::Seek;
        let mut f = std::fs::File::open(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        f.seek(std::io::SeekFrom::Start(hasher.len()))
            .with_context(|| format!("cannot read {}", path.display()))?;
        let mut f = f.take(upto - hasher.len());
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f
                .read(&mut buf)
                .with_context(|| format!("cannot read {}", path.display()))?;
            if n == 0 {
                return Ok(hasher);
            }
            hasher.update(&buf[..n]);
        }
    })
    .await
    .context("the hashing task failed")?
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Makes the snapshot of `commit` (links into `blobs/`) and points
/// `refs/<revision>` at it; returns the snapshot folder. A new snapshot is
/// built in a hidden folder and renamed into place, so that it appears
/// whole.
fn publish(
    repo_dir: &Path,
    commit: &str,
    revision: &str,
    files: &[File],
) -> anyhow::Result<PathBuf> {
    let snapshots = repo_dir.join("snapshots");
    let snapshot = snapshots.join(commit);
    let building = if snapshot.is_dir() {
        snapshot.clone()
    } else {
        let tmp = snapshots.join(format!(".{commit}{INCOMPLETE}"));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp)
                .with_context(|| format!("cannot clear {}", tmp.display()))?;
        }
        tmp
    };
    for f in files {
        let link = building.join(&f.path);
        if let Some(parent) = link.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        if std::fs::symlink_metadata(&link).is_ok() {
            std::fs::remove_file(&link)
                .with_context(|| format!("cannot replace {}", link.display()))?;
        }
        std::os::unix::fs::symlink(link_target(&f.path, &f.blob), &link)
            .with_context(|| format!("cannot link {}", link.display()))?;
    }
    if building != snapshot {
        std::fs::rename(&building, &snapshot)
            .with_context(|| format!("cannot move {} into place", snapshot.display()))?;
    }
    // A commit asked for by its hash has no ref (as the hub client does).
    if revision != commit {
        let refs = repo_dir.join("refs").join(revision);
        let parent = refs.parent().expect("a ref has a folder");
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
        let tmp = parent.join(format!(
            ".{}{INCOMPLETE}",
            refs.file_name().unwrap_or_default().to_string_lossy()
        ));
        std::fs::write(&tmp, commit).with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, &refs).with_context(|| format!("cannot write {}", refs.display()))?;
    }
    Ok(snapshot)
}

// ---------------------------------------------------------------------------
// progress

/// The bytes a pull has so far, told to its sink.
struct Progress<'a> {
    sink: &'a dyn Sink,
    done: AtomicU64,
    /// What was in the cache before the pull began.
    already: u64,
    total: u64,
    started: Instant,
}

impl Progress<'_> {
    fn add(&self, n: u64) {
        self.done.fetch_add(n, Ordering::Relaxed);
        self.sink.added(n);
    }

    fn report(&self) {
        let now = self.done.load(Ordering::Relaxed);
        let seconds = self.started.elapsed().as_secs_f64().max(0.001);
        self.sink.event(&Event::Progress {
            bytes: now,
            total: self.total,
            bytes_per_second: ((now - self.already) as f64 / seconds) as u64,
        });
    }
}

/// How `hangar pull` shows progress: a bar on a terminal, a line every
/// five seconds otherwise, or every event as JSON.
struct Cli {
    mode: Mode,
    bar: Option<indicatif::ProgressBar>,
    last_line: std::sync::Mutex<Instant>,
}

impl Cli {
    fn new(mode: Mode, plan: &Plan) -> Cli {
        let bar = (mode == Mode::Bar).then(|| {
            let bar = indicatif::ProgressBar::new(plan.total_bytes);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
                )
                .expect("the template parses"),
            );
            bar.set_position(plan.total_bytes - plan.to_fetch);
            bar
        });
        Cli {
            mode,
            bar,
            last_line: std::sync::Mutex::new(Instant::now()),
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl Sink for Cli {
    fn added(&self, n: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(n);
        }
    }

    fn event(&self, event: &Event<'_>) {
        match (self.mode, event) {
            // A closed stdout ends the pull at its next line, not here.
            (Mode::Json, event) => drop(emit(event)),
            (Mode::Plain, Event::File { path, size, .. }) => {
                eprintln!("pull: {path} done ({})", bytes(*size));
            }
            (
                Mode::Plain,
                Event::Progress {
                    bytes: now,
                    total,
                    bytes_per_second,
                },
            ) => {
                let mut last = self.last_line.lock().expect("no panics hold it");
                if last.elapsed() >= Duration::from_secs(5) {
                    *last = Instant::now();
                    eprintln!(
                        "pull: {} of {} ({}/s)",
                        bytes(*now),
                        bytes(*total),
                        bytes(*bytes_per_second)
                    );
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use expect_test::{expect, Expect};

    use super::*;

    fn check_parse(input: &str, expected: Expect) {
        let got = match RepoRef::parse(input) {
            Ok(r) => format!("{} @ {} -> {}", r.repo, r.revision, r.folder_name()),
            Err(e) => format!("error: {e}"),
        };
        expected.assert_eq(&got);
    }

    #[test]
    fn revisions_parse() {
        check_parse(
            "Qwen/Qwen3-0.6B",
            expect!["Qwen/Qwen3-0.6B @ main -> models--Qwen--Qwen3-0.6B"],
        );
        check_parse("gpt2", expect!["gpt2 @ main -> models--gpt2"]);
        check_parse("org/m@v1.0", expect!["org/m @ v1.0 -> models--org--m"]);
        check_parse(
            "org/m@refs/pr/1",
            expect!["org/m @ refs/pr/1 -> models--org--m"],
        );
        check_parse(
            "org/m@0123456789abcdef0123456789abcdef01234567",
            expect!["org/m @ 0123456789abcdef0123456789abcdef01234567 -> models--org--m"],
        );
        check_parse("a/b/c", expect!["error: 'a/b/c' is not a repository: use ORG/NAME or ORG/NAME@REVISION (letters, digits, '-', '_' and '.'; for example Qwen/Qwen3-0.6B@main)"]);
        check_parse("../x", expect!["error: '../x' is not a repository: use ORG/NAME or ORG/NAME@REVISION (letters, digits, '-', '_' and '.'; for example Qwen/Qwen3-0.6B@main)"]);
        check_parse("org/", expect!["error: 'org/' is not a repository: use ORG/NAME or ORG/NAME@REVISION (letters, digits, '-', '_' and '.'; for example Qwen/Qwen3-0.6B@main)"]);
        check_parse("org/m@", expect!["error: '' (in 'org/m@') is not a revision: use a branch, tag or commit hash such as main, v1.0 or refs/pr/1"]);
        check_parse("org/m@../../etc", expect!["error: '../../etc' (in 'org/m@../../etc') is not a revision: use a branch, tag or commit hash such as main, v1.0 or refs/pr/1"]);
    }

    #[test]
    fn a_pull_is_refused_when_nothing_serves_it_or_it_outgrows_the_guard() {
        let refusal = |engine: Option<&str>, need: u64, ceiling: Option<u64>| {
            let plan = Plan {
                repo: "org/m".into(),
                revision: "main".into(),
                commit: "abc".into(),
                endpoint: DEFAULT_ENDPOINT.into(),
                files: vec![],
                total_bytes: 0,
                to_fetch: 0,
                format: Some("mlx".into()),
                rule: None,
                engine: engine.map(str::to_string),
                reason: "no plugin serves format 'mlx' here".into(),
                need_bytes: need,
                ceiling_bytes: ceiling,
                fits: ceiling.map(|c| need <= c),
                cache: PathBuf::from("/c"),
            };
            match plan.refusal(Guard::Balanced, "--force") {
                Some(r) => format!("{:?}: {}", r.kind, r.message),
                None => "pulled".into(),
            }
        };
        let gib = 1 << 30;
        expect!["pulled"].assert_eq(&refusal(Some("mlx-lm"), gib, Some(2 * gib)));
        expect!["pulled"].assert_eq(&refusal(Some("mlx-lm"), 8 * gib, None));
        expect!["TooBig: refusing to pull org/m: it needs about 3.0 GiB of memory, more than the balanced memory guard's ceiling of 2.0 GiB; pass --force to download it anyway"]
            .assert_eq(&refusal(Some("mlx-lm"), 3 * gib, Some(2 * gib)));
        expect!["Unservable: refusing to pull org/m: no installed plugin can serve it (no plugin serves format 'mlx' here); pass --force to download it anyway"]
            .assert_eq(&refusal(None, 3 * gib, Some(2 * gib)));
    }

    #[tokio::test]
    async fn a_resume_hashes_from_the_checkpoint_a_broken_pull_left() {
        let temp = tempfile::tempdir().unwrap();
        let partial = temp.path().join("blob.incomplete");
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let want: [u8; 32] = <sha2::Sha256 as sha2::Digest>::digest(&data).into();
        let file = File {
            path: "model.safetensors".into(),
            size: data.len() as u64,
            blob: "blob".into(),
            sha256: Some(hex(&want)),
        };
        // A pull that broke off after 100 000 bytes: its drop kept the state.
        std::fs::write(&partial, &data[..100_000]).unwrap();
        let mut broken = Hashing::new(&file, &partial);
        broken.update(&data[..100_000]);
        drop(broken);
        let checkpoint = temp.path().join("blob.incomplete.sha256");
        assert!(checkpoint.is_file());
        // The next one fetched the rest; it reads none of the first part.
        std::fs::write(&partial, &data).unwrap();
        let resumed = |partial: PathBuf| {
            let file = file.clone();
            async move {
                let mut hashing = Hashing::new(&file, &partial);
                hashing.catch_up(&partial, file.size).await.unwrap();
                hashing.finish().unwrap()
            }
        };
        // Its first part is not read: zeroed, it still hashes as the data.
        let mut zeroed = std::fs::read(&partial).unwrap();
        zeroed[..100_000].fill(0);
        std::fs::write(&partial, &zeroed).unwrap();
        assert_eq!(
            resumed(partial.clone()).await,
            want,
            "the checkpoint stood for the first part"
        );
        assert!(!checkpoint.exists(), "a whole file needs no checkpoint");
        // Without one (a pull killed outright), the whole file is hashed.
        assert_ne!(resumed(partial.clone()).await, want);
        std::fs::write(&partial, &data).unwrap();
        assert_eq!(resumed(partial.clone()).await, want);
        // A checkpoint past the file's end is not of it.
        let mut ahead = sha256::Sha256::default();
        ahead.update(&[data.as_slice(), b"more"].concat());
        std::fs::write(&checkpoint, ahead.checkpoint()).unwrap();
        assert_eq!(resumed(partial).await, want);
    }

    #[test]
    fn include_globs_select_by_path() {
        let files = [
            "config.json",
            "model.safetensors",
            "q4/m-Q4_K_M.gguf",
            "m-Q8_0.gguf",
            "README.md",
        ];
        let pick = |globs: &[&str]| -> String {
            let globs: Vec<String> = globs.iter().map(|g| g.to_string()).collect();
            match Include::new(&globs) {
                Ok(inc) => files
                    .iter()
                    .filter(|f| inc.matches(f))
                    .copied()
                    .collect::<Vec<_>>()
                    .join(" "),
                Err(e) => format!("error: {e}"),
            }
        };
        expect!["config.json model.safetensors q4/m-Q4_K_M.gguf m-Q8_0.gguf README.md"]
            .assert_eq(&pick(&[]));
        expect!["q4/m-Q4_K_M.gguf m-Q8_0.gguf"].assert_eq(&pick(&["*.gguf"]));
        expect!["config.json q4/m-Q4_K_M.gguf"].assert_eq(&pick(&["*Q4_K_M*", "*.json"]));
        expect!["error: --include 'a[' is not a glob: error parsing glob 'a[': unclosed character class; missing ']'"].assert_eq(&pick(&["a["]));
    }

    #[test]
    fn snapshot_links_are_relative_to_blobs() {
        expect!["../../blobs/abc"]
            .assert_eq(&link_target("config.json", "abc").display().to_string());
        expect!["../../../../blobs/abc"]
            .assert_eq(&link_target("a/b/m.gguf", "abc").display().to_string());
    }

    #[test]
    fn hub_paths_that_leave_the_repository_are_refused() {
        let verdicts: Vec<String> = [
            "config.json",
            "a/b.gguf",
            "../x",
            "/etc/passwd",
            "a//b",
            "a\\b",
            "",
        ]
        .iter()
        .map(|p| format!("{p:?}: {}", safe_path(p)))
        .collect();
        expect![[r#""config.json": true, "a/b.gguf": true, "../x": false, "/etc/passwd": false, "a//b": false, "a\\b": false, "": false"#]]
            .assert_eq(&verdicts.join(", "));
    }

    #[test]
    fn urls_encode_what_paths_may_not_hold() {
        expect!["http://h/org/m/resolve/abc/dir/a%20b%2B.json"].assert_eq(&resolve_url(
            "http://h",
            "org/m",
            "abc",
            "dir/a b+.json",
        ));
        expect!["refs%2Fpr%2F1"].assert_eq(&encode("refs/pr/1", false));
    }
}
