//! Pulls over the API: `POST /api/models/pull` plans a pull as `hangar pull`
//! does (and refuses what it would refuse) and starts it as a task of its
//! own; `GET /api/models/pulls[/{id}]` shows the pulls, `GET
//! /api/models/pulls/{id}/events` streams one's progress, and `DELETE
//! /api/models/pulls/{id}` cancels it.
//!
//! A pull never blocks serving: it runs on the host's runtime like any
//! request, holds no lock the scheduler or the sessions use, hashes files
//! off the async threads, and at most [`MAX_RUNNING`] fetch at once (later
//! ones wait as `queued`). It fills the cache `hangar pull` fills (the
//! server's `HF_HUB_CACHE`, else `HF_HOME/hub`, else
//! `~/.cache/huggingface/hub`), which the catalog reads too, so the pulled
//! model is served at once and after a restart (with `hf_cache = false` in
//! `config.toml`, only until the host stops).
//! A cancelled pull keeps its `.incomplete` files, and the next pull of the
//! repository continues them.

use std::collections::{BTreeSet, VecDeque};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::Json;
use futures_util::stream::{self, Stream, StreamExt};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::broadcast::{self, error::RecvError};
use tokio_util::sync::CancellationToken;
use utoipa::ToSchema;

use super::{ApiError, App, PathId};
use crate::pull::{self, Event, Plan, RefusalKind, RepoRef, Sink};

/// Pulls that fetch at once; more wait their turn.
pub(crate) const MAX_RUNNING: usize = 2;

/// Files one pull fetches at once (as `hangar pull --jobs`' default).
const JOBS: usize = 4;

/// Finished pulls kept for `GET /api/models/pulls`.
const KEPT: usize = 50;

/// How often an idle event stream sends a comment, so proxies keep it open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The pulls of this host, running and finished.
pub(crate) struct Pulls {
    jobs: Mutex<Vec<Arc<Job>>>,
    next: AtomicU64,
    running: tokio::sync::Semaphore,
}

impl Default for Pulls {
    fn default() -> Pulls {
        Pulls {
            jobs: Mutex::default(),
            next: AtomicU64::new(1),
            running: tokio::sync::Semaphore::new(MAX_RUNNING),
        }
    }
}

impl Pulls {
    fn find(&self, id: &str) -> Result<Arc<Job>, ApiError> {
        self.jobs
            .lock()
            .expect("pulls lock")
            .iter()
            .find(|j| j.id == id)
            .cloned()
            .ok_or_else(|| {
                ApiError::not_found(format!("no pull '{id}'; GET /api/models/pulls lists them"))
            })
    }

    /// The pull of `repo` still running, if any.
    fn active(&self, repo: &str) -> Option<Arc<Job>> {
        self.jobs
            .lock()
            .expect("pulls lock")
            .iter()
            .find(|j| j.plan.repo == repo && !j.inner().state.finished())
            .cloned()
    }
}

/// Where a pull is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum PullState {
    /// Waiting for one of the running pulls to end.
    Queued,
    Running,
    /// Every file is in the cache and the catalog was rescanned.
    Done,
    Failed,
    /// Cancelled by `DELETE`; what was fetched is kept for the next pull.
    Cancelled,
}

impl PullState {
    fn finished(self) -> bool {
        matches!(
            self,
            PullState::Done | PullState::Failed | PullState::Cancelled
        )
    }
}

/// One file of a pull.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct PullFile {
    /// Its path in the repository.
    path: String,
    size: u64,
    /// Whether it is complete in the cache.
    done: bool,
}

/// A pull, as `GET /api/models/pulls/{id}` shows it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct PullStatus {
    /// The pull's id (`pull-N`).
    id: String,
    /// The repository, `ORG/NAME`.
    repo: String,
    revision: String,
    /// The commit the revision named when the pull began.
    commit: String,
    state: PullState,
    /// Bytes in the cache, of `bytes_total`.
    bytes_done: u64,
    bytes_total: u64,
    /// Bytes fetched per second since the pull began.
    bytes_per_second: u64,
    files: Vec<PullFile>,
    /// The format Hangar's recognition rules see, if any.
    format: Option<String>,
    /// The engine that would serve it, if any.
    engine: Option<String>,
    /// Why that engine, or why none.
    reason: String,
    /// The memory estimate, and whether it fits under the memory guard.
    need_bytes: u64,
    fits: Option<bool>,
    /// The Hugging Face cache it goes into.
    cache: String,
    /// The model's id in the catalog once done (null when no rule
    /// recognises it: a pull with `force`).
    model: Option<String>,
    /// The snapshot folder, once done.
    path: Option<String>,
    /// Why it failed.
    error: Option<String>,
    /// Seconds since the epoch.
    started_at: u64,
    ended_at: Option<u64>,
}

/// `GET /api/models/pulls`.
#[derive(Serialize, ToSchema)]
pub(crate) struct PullList {
    /// Newest last; finished pulls are kept for a while.
    pulls: Vec<PullStatus>,
}

/// The body of `POST /api/models/pull`.
#[derive(serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // The type exists for its schema: the handler checks a JSON value.
pub(crate) struct PullRequest {
    /// The repository, `ORG/NAME` (or `ORG/NAME@REVISION`).
    #[schema(example = "mlx-community/Qwen3-0.6B-4bit")]
    repo: String,
    /// A branch, tag or commit (default `main`).
    revision: Option<String>,
    /// Fetch only the files whose paths match one of these globs.
    include: Option<Vec<String>>,
    /// Pull even what no installed plugin serves or what does not fit
    /// under the memory guard.
    force: Option<bool>,
}

/// What changes while a pull runs.
struct Inner {
    state: PullState,
    files_done: BTreeSet<String>,
    rate: u64,
    model: Option<String>,
    path: Option<String>,
    error: Option<String>,
    ended_at: Option<u64>,
    /// What the event stream replays: every event, the latest progress
    /// only.
    events: Vec<Value>,
}

/// One pull.
struct Job {
    id: String,
    plan: Plan,
    started_at: u64,
    bytes_done: AtomicU64,
    inner: Mutex<Inner>,
    feed: broadcast::Sender<Value>,
    cancel: CancellationToken,
    ended: tokio::sync::watch::Sender<bool>,
}

impl Job {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("pull lock")
    }

    fn status(&self) -> PullStatus {
        let inner = self.inner();
        let plan = &self.plan;
        PullStatus {
            id: self.id.clone(),
            repo: plan.repo.clone(),
            revision: plan.revision.clone(),
            commit: plan.commit.clone(),
            state: inner.state,
            bytes_done: self.bytes_done.load(Ordering::Relaxed),
            bytes_total: plan.total_bytes,
            bytes_per_second: inner.rate,
            files: plan
                .files
                .iter()
                .map(|f| PullFile {
                    path: f.path.clone(),
                    size: f.size,
                    done: inner.files_done.contains(&f.path),
                })
                .collect(),
            format: plan.format.clone(),
            engine: plan.engine.clone(),
            reason: plan.reason.clone(),
            need_bytes: plan.need_bytes,
            fits: plan.fits,
            cache: plan.cache.display().to_string(),
            model: inner.model.clone(),
            path: inner.path.clone(),
            error: inner.error.clone(),
            started_at: self.started_at,
            ended_at: inner.ended_at,
        }
    }

    /// Records `event` and sends it to the event streams, under the lock so
    /// that a subscriber's replay and feed meet without a gap or a repeat.
    fn push(&self, inner: &mut Inner, event: Value) {
        let progress = |e: &Value| e["event"] == "progress";
        if progress(&event) && inner.events.last().is_some_and(progress) {
            inner.events.pop();
        }
        inner.events.push(event.clone());
        let _ = self.feed.send(event);
    }

    /// Ends the pull in `state`, with its last event.
    fn end(&self, state: PullState, event: Value) {
        let mut inner = self.inner();
        inner.state = state;
        inner.ended_at = Some(now());
        if let Some(message) = event["message"].as_str() {
            inner.error = Some(message.to_string());
        }
        self.push(&mut inner, event);
        drop(inner);
        self.ended.send_replace(true);
    }

    fn subscribe(&self) -> (Vec<Value>, broadcast::Receiver<Value>) {
        let inner = self.inner();
        (inner.events.clone(), self.feed.subscribe())
    }
}

impl Sink for Job {
    fn added(&self, n: u64) {
        self.bytes_done.fetch_add(n, Ordering::Relaxed);
    }

    fn event(&self, event: &Event<'_>) {
        let mut inner = self.inner();
        match event {
            Event::Progress {
                bytes,
                bytes_per_second,
                ..
            } => {
                self.bytes_done.store(*bytes, Ordering::Relaxed);
                inner.rate = *bytes_per_second;
            }
            Event::File { path, .. } => {
                inner.files_done.insert(path.to_string());
            }
            // The pull's own `done` comes once the catalog has the model.
            Event::Done { .. } => return,
            Event::Plan(_) | Event::Error { .. } => {}
        }
        let value = serde_json::to_value(event).expect("events serialize");
        self.push(&mut inner, value);
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The API's answer to a pull the planner refused.
/// What pulling `target` (its files matching `include`) into the
/// server's cache would do, as the hub and the installed plugins say; with
/// the hub and the cache it is planned for.
pub(super) async fn plan_of(
    app: &App,
    target: &RepoRef,
    include: &[String],
) -> Result<(pull::Hub, std::path::PathBuf, pull::Plan), ApiError> {
    let hub = pull::Hub::from_env().map_err(refused)?;
    let cache = pull::default_cache().map_err(refused)?;
    let limits = app.scheduler.limits();
    let wanted = pull::Wanted {
        target,
        include,
        guard: limits.guard,
        memory_limit: limits.memory_limit,
    };
    let defaults = app.sessions.settings().get().default_engines;
    let plan = pull::plan(&hub, &cache, &wanted, app.sessions.registry(), &defaults)
        .await
        .map_err(refused)?;
    Ok((hub, cache, plan))
}

pub(super) fn refused(refusal: pull::Refusal) -> ApiError {
    let (status, code, param) = match refusal.kind {
        RefusalKind::BadInput(field) => (StatusCode::BAD_REQUEST, "invalid_request", Some(field)),
        RefusalKind::Unauthorized => (StatusCode::UNAUTHORIZED, "hub_unauthorized", None),
        RefusalKind::Forbidden => (StatusCode::FORBIDDEN, "hub_forbidden", None),
        RefusalKind::NotFound => (StatusCode::NOT_FOUND, "repo_not_found", Some("repo")),
        RefusalKind::Unservable => (StatusCode::UNPROCESSABLE_ENTITY, "unservable", None),
        RefusalKind::TooBig => (StatusCode::UNPROCESSABLE_ENTITY, "too_big", None),
        RefusalKind::NoDisk => (StatusCode::INSUFFICIENT_STORAGE, "no_disk_space", None),
        RefusalKind::Hub => (StatusCode::BAD_GATEWAY, "hub_failed", None),
        RefusalKind::Host => (StatusCode::INTERNAL_SERVER_ERROR, "host_error", None),
    };
    let kind = match status.as_u16() {
        401 | 403 => "authentication_error",
        500.. => "server_error",
        _ => "invalid_request_error",
    };
    ApiError {
        status,
        kind,
        code,
        ..ApiError::bad_request(refusal.message, param)
    }
}

/// The fields of `POST /api/models/pull`, checked one by one so that a
/// refusal names the field.
struct Asked {
    target: RepoRef,
    include: Vec<String>,
    force: bool,
}

fn read_body(body: &[u8]) -> Result<Asked, ApiError> {
    let bad = |message: String, field: &'static str| ApiError::bad_request(message, Some(field));
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(
            format!("the body is not JSON ({e}); send {{\"repo\": \"ORG/NAME\"}}"),
            None,
        )
    })?;
    let Value::Object(fields) = value else {
        return Err(ApiError::bad_request(
            "the body must be a JSON object such as {\"repo\": \"ORG/NAME\"}",
            None,
        ));
    };
    for key in fields.keys() {
        if !matches!(key.as_str(), "repo" | "revision" | "include" | "force") {
            return Err(ApiError::unknown_field(
                key,
                format!("unknown field '{key}'; a pull takes repo, revision, include and force"),
            ));
        }
    }
    let repo = match fields.get("repo") {
        Some(Value::String(repo)) => repo.as_str(),
        Some(_) => return Err(bad("'repo' must be a string, ORG/NAME".into(), "repo")),
        None => return Err(bad("'repo' is required: ORG/NAME".into(), "repo")),
    };
    let target = match fields.get("revision") {
        None | Some(Value::Null) => RepoRef::parse(repo).map_err(|e| bad(e, "repo"))?,
        Some(Value::String(revision)) => {
            if repo.contains('@') {
                return Err(bad(
                    format!("'repo' '{repo}' names a revision, and so does 'revision'; give one"),
                    "repo",
                ));
            }
            RepoRef::parse(repo).map_err(|e| bad(e, "repo"))?;
            RepoRef::parse(&format!("{repo}@{revision}")).map_err(|e| bad(e, "revision"))?
        }
        Some(_) => {
            return Err(bad(
                "'revision' must be a string: a branch, tag or commit".into(),
                "revision",
            ))
        }
    };
    let include = match fields.get("include") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(globs)) => globs
            .iter()
            .map(|g| g.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("'include' must be a list of glob strings".into(), "include"))?,
        Some(_) => {
            return Err(bad(
                "'include' must be a list of glob strings".into(),
                "include",
            ))
        }
    };
    let force = match fields.get("force") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(force)) => *force,
        Some(_) => return Err(bad("'force' must be true or false".into(), "force")),
    };
    Ok(Asked {
        target,
        include,
        force,
    })
}

fn already_pulling(job: &Job) -> ApiError {
    ApiError {
        status: StatusCode::CONFLICT,
        code: "already_pulling",
        ..ApiError::bad_request(
            format!(
                "{} is already being pulled ({}); follow GET /api/models/pulls/{} or cancel it with DELETE",
                job.plan.repo, job.id, job.id
            ),
            Some("repo"),
        )
    }
}

/// `POST /api/models/pull`.
#[utoipa::path(post, path = "/api/models/pull", tag = "manage",
    request_body(content = PullRequest, content_type = "application/json"),
    responses(
        (status = 202, description = "The pull started (or waits its turn); follow it at /api/models/pulls/{id}", body = PullStatus),
        (status = 400, description = "A field is wrong (the message names it)", body = super::schema::Error),
        (status = 401, description = "The hub wants a token for the repository: set HF_TOKEN on the server", body = super::schema::Error),
        (status = 404, description = "No such repository or revision on the hub", body = super::schema::Error),
        (status = 409, description = "The repository is already being pulled", body = super::schema::Error),
        (status = 422, description = "No installed plugin serves it, or it does not fit under the memory guard (pass force)", body = super::schema::Error),
        (status = 507, description = "Not enough disk space in the cache", body = super::schema::Error),
        (status = "4XX", description = "The request cannot be served as sent (the message names the field)", body = super::schema::Error),
        (status = "5XX", description = "The hub cannot be reached, or the host failed", body = super::schema::Error)
    ))]
pub(super) async fn start(
    State(app): State<Arc<App>>,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<PullStatus>), ApiError> {
    let asked = read_body(&body)?;
    if let Some(job) = app.pulls.active(&asked.target.repo) {
        return Err(already_pulling(&job));
    }
    let (hub, _, plan) = plan_of(&app, &asked.target, &asked.include).await?;
    if let Some(refusal) = plan
        .refusal(app.scheduler.limits().guard, "\"force\": true")
        .filter(|_| !asked.force)
    {
        return Err(refused(refusal));
    }
    let check = plan.clone();
    tokio::task::spawn_blocking(move || check.check_disk())
        .await
        .map_err(|e| ApiError::internal(format!("the disk check failed: {e}")))?
        .map_err(refused)?;

    let job = {
        let mut jobs = app.pulls.jobs.lock().expect("pulls lock");
        // Checked again: another request may have planned the same one.
        if let Some(job) = jobs
            .iter()
            .find(|j| j.plan.repo == plan.repo && !j.inner().state.finished())
        {
            return Err(already_pulling(job));
        }
        let id = format!("pull-{}", app.pulls.next.fetch_add(1, Ordering::Relaxed));
        let job = Arc::new(Job {
            id,
            started_at: now(),
            bytes_done: AtomicU64::new(plan.total_bytes - plan.to_fetch),
            inner: Mutex::new(Inner {
                state: PullState::Queued,
                files_done: BTreeSet::new(),
                rate: 0,
                model: None,
                path: None,
                error: None,
                ended_at: None,
                events: Vec::new(),
            }),
            feed: broadcast::channel(256).0,
            cancel: app.sessions.closing().child_token(),
            ended: tokio::sync::watch::channel(false).0,
            plan,
        });
        job.event(&Event::Plan(&job.plan));
        // Finished pulls beyond the kept ones go, oldest first.
        let finished = jobs.iter().filter(|j| j.inner().state.finished()).count();
        let mut extra = (finished + 1).saturating_sub(KEPT);
        jobs.retain(|j| {
            let gone = extra > 0 && j.inner().state.finished();
            extra -= usize::from(gone);
            !gone
        });
        jobs.push(job.clone());
        job
    };
    app.sessions.record(
        "pull_started",
        &job.plan.repo,
        None,
        format!(
            "{}: pulling {}@{} ({} of {} to fetch) into {}",
            job.id,
            job.plan.repo,
            job.plan.revision,
            crate::scheduler::guard::bytes(job.plan.to_fetch),
            crate::scheduler::guard::bytes(job.plan.total_bytes),
            job.plan.cache.display()
        ),
    );
    tokio::spawn(run(app.clone(), job.clone(), hub));
    Ok((StatusCode::ACCEPTED, Json(job.status())))
}

/// The pull's task: waits its turn, fetches, and has the catalog rescan.
async fn run(app: Arc<App>, job: Arc<Job>, hub: pull::Hub) {
    let permit = tokio::select! {
        permit = app.pulls.running.acquire() => permit.expect("the semaphore stays open"),
        () = job.cancel.cancelled() => return cancelled(&app, &job),
    };
    job.inner().state = PullState::Running;
    let outcome = tokio::select! {
        outcome = pull::execute(&hub, &job.plan, JOBS, &*job) => outcome,
        () = job.cancel.cancelled() => return cancelled(&app, &job),
    };
    drop(permit);
    let pulled = match outcome {
        Ok(pulled) => pulled,
        Err(e) => {
            let message = format!("{e:#}");
            app.sessions.record(
                "pull_failed",
                &job.plan.repo,
                None,
                format!("{}: {message}", job.id),
            );
            return job.end(
                PullState::Failed,
                json!({"event": "failed", "message": message}),
            );
        }
    };
    let added = app.catalog.read_too(job.plan.cache.clone());
    let discovery = app.catalog.rescan().await;
    let model = discovery
        .models
        .iter()
        .find(|m| m.id == job.plan.repo)
        .map(|m| m.id.clone());
    let path = pulled.snapshot.display().to_string();
    {
        let mut inner = job.inner();
        inner.model = model.clone();
        inner.path = Some(path.clone());
    }
    app.sessions.record(
        "pull_done",
        &job.plan.repo,
        None,
        format!(
            "{}: pulled {}@{} into {path} ({} fetched){}",
            job.id,
            job.plan.repo,
            job.plan.revision,
            crate::scheduler::guard::bytes(pulled.fetched),
            // Only with `hf_cache = false` is the cache not read at start.
            if added && app.catalog.hf_cache().is_none() {
                format!(
                    "; the catalog reads {} until the host stops (config.toml has hf_cache = false: \
                     add the cache to model_dirs to serve it after a restart)",
                    job.plan.cache.display()
                )
            } else {
                String::new()
            }
        ),
    );
    job.end(
        PullState::Done,
        json!({"event": "done", "model": model, "path": path, "commit": job.plan.commit, "fetched": pulled.fetched}),
    );
}

fn cancelled(app: &App, job: &Job) {
    app.sessions.record(
        "pull_cancelled",
        &job.plan.repo,
        None,
        format!(
            "{}: cancelled; what was fetched is kept, and the next pull of {} continues it",
            job.id, job.plan.repo
        ),
    );
    job.end(PullState::Cancelled, json!({"event": "cancelled"}));
}

/// `GET /api/models/pulls`.
#[utoipa::path(get, path = "/api/models/pulls", tag = "manage",
    responses(
        (status = 200, description = "The pulls, running and recently finished, oldest first", body = PullList),
        (status = "4XX", description = "The request cannot be served as sent", body = super::schema::Error)
    ))]
pub(super) async fn list(State(app): State<Arc<App>>) -> Json<PullList> {
    let jobs = app.pulls.jobs.lock().expect("pulls lock").clone();
    Json(PullList {
        pulls: jobs.iter().map(|j| j.status()).collect(),
    })
}

/// `GET /api/models/pulls/{id}`.
#[utoipa::path(get, path = "/api/models/pulls/{id}", tag = "manage",
    params(("id" = String, Path, description = "A pull's id (`pull-N`)")),
    responses(
        (status = 200, description = "The pull", body = PullStatus),
        (status = "4XX", description = "No such pull", body = super::schema::Error)
    ))]
pub(super) async fn status(
    State(app): State<Arc<App>>,
    PathId(id): PathId,
) -> Result<Json<PullStatus>, ApiError> {
    Ok(Json(app.pulls.find(&id)?.status()))
}

/// `DELETE /api/models/pulls/{id}`.
#[utoipa::path(delete, path = "/api/models/pulls/{id}", tag = "manage",
    params(("id" = String, Path, description = "A pull's id (`pull-N`)")),
    responses(
        (status = 200, description = "The pull ended (cancelled, or it had finished before): its final status", body = PullStatus),
        (status = "4XX", description = "No such pull", body = super::schema::Error)
    ))]
pub(super) async fn cancel(
    State(app): State<Arc<App>>,
    PathId(id): PathId,
) -> Result<Json<PullStatus>, ApiError> {
    let job = app.pulls.find(&id)?;
    job.cancel.cancel();
    // The task ends at its next await; a file write in progress finishes.
    let mut ended = job.ended.subscribe();
    let _ = tokio::time::timeout(Duration::from_secs(10), ended.wait_for(|e| *e)).await;
    Ok(Json(job.status()))
}

/// `GET /api/models/pulls/{id}/events`.
#[utoipa::path(get, path = "/api/models/pulls/{id}/events", tag = "manage",
    params(("id" = String, Path, description = "A pull's id (`pull-N`)")),
    responses(
        (status = 200, description = "The pull's events so far (`plan`, `file`, the latest `progress`), then each new one, as server-sent events of JSON with an `event` field; ends after the final `done`, `failed` or `cancelled`", content_type = "text/event-stream", body = String),
        (status = "4XX", description = "No such pull", body = super::schema::Error)
    ))]
pub(super) async fn events(
    State(app): State<Arc<App>>,
    PathId(id): PathId,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let job = app.pulls.find(&id)?;
    let (past, feed) = job.subscribe();
    let reader = (VecDeque::from(past), feed, false);
    let stream = stream::unfold(reader, |(mut past, mut feed, ended)| async move {
        if ended {
            return None;
        }
        let event = match past.pop_front() {
            Some(event) => event,
            None => match feed.recv().await {
                Ok(event) => event,
                Err(RecvError::Lagged(missed)) => {
                    let lagged = SseEvent::default().event("lagged").data(missed.to_string());
                    return Some((Ok(lagged), (past, feed, false)));
                }
                Err(RecvError::Closed) => return None,
            },
        };
        let last = matches!(
            event["event"].as_str(),
            Some("done" | "failed" | "cancelled")
        );
        let data = SseEvent::default().data(event.to_string());
        Some((Ok(data), (past, feed, last)))
    });
    let closing = app.sessions.closing();
    let stream = stream.take_until(async move { closing.cancelled_owned().await });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)))
}

#[cfg(test)]
mod tests {
    use expect_test::{expect, Expect};

    use super::*;

    fn check(body: &str, expected: Expect) {
        let got = match read_body(body.as_bytes()) {
            Ok(a) => format!(
                "{} @ {} include={:?} force={}",
                a.target.repo, a.target.revision, a.include, a.force
            ),
            Err(e) => format!("{} {:?}: {}", e.status.as_u16(), e.param, e.message),
        };
        expected.assert_eq(&got);
    }

    #[test]
    fn pull_bodies_are_read_field_by_field() {
        check(
            r#"{"repo": "org/m"}"#,
            expect![[r#"org/m @ main include=[] force=false"#]],
        );
        check(
            r#"{"repo": "org/m", "revision": "v1", "include": ["*.gguf"], "force": true}"#,
            expect![[r#"org/m @ v1 include=["*.gguf"] force=true"#]],
        );
        check(
            r#"{"repo": "org/m@v2"}"#,
            expect![[r#"org/m @ v2 include=[] force=false"#]],
        );
        check(
            r#"{}"#,
            expect![[r#"400 Some("repo"): 'repo' is required: ORG/NAME"#]],
        );
        check(
            r#"{"repo": 3}"#,
            expect![[r#"400 Some("repo"): 'repo' must be a string, ORG/NAME"#]],
        );
        check(
            r#"{"repo": "a/b/c"}"#,
            expect![[
                r#"400 Some("repo"): 'a/b/c' is not a repository: use ORG/NAME or ORG/NAME@REVISION (letters, digits, '-', '_' and '.'; for example Qwen/Qwen3-0.6B@main)"#
            ]],
        );
        check(
            r#"{"repo": "org/m", "revision": "../x"}"#,
            expect![[
                r#"400 Some("revision"): '../x' (in 'org/m@../x') is not a revision: use a branch, tag or commit hash such as main, v1.0 or refs/pr/1"#
            ]],
        );
        check(
            r#"{"repo": "org/m@v1", "revision": "v2"}"#,
            expect![[
                r#"400 Some("repo"): 'repo' 'org/m@v1' names a revision, and so does 'revision'; give one"#
            ]],
        );
        check(
            r#"{"repo": "org/m", "include": "*.gguf"}"#,
            expect![[r#"400 Some("include"): 'include' must be a list of glob strings"#]],
        );
        check(
            r#"{"repo": "org/m", "force": "yes"}"#,
            expect![[r#"400 Some("force"): 'force' must be true or false"#]],
        );
        check(
            r#"{"repo": "org/m", "mirror": "x"}"#,
            expect![[
                r#"400 Some("mirror"): unknown field 'mirror'; a pull takes repo, revision, include and force"#
            ]],
        );
        check(
            r#"[1]"#,
            expect![[r#"400 None: the body must be a JSON object such as {"repo": "ORG/NAME"}"#]],
        );
    }
}
