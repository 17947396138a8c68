//! Live feeds for operators (the `/admin` page): `GET /api/events/stream`
//! and `GET /api/sessions/{id}/logs/stream`, as server-sent events. Each
//! sends what is recorded so far, then every new item as it happens; an
//! `event: lagged` says how many items a slow reader missed. A log stream
//! ends when its session's engine is gone; every stream ends when the host
//! shuts down.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::stream::{self, Stream, StreamExt};
use serde::Serialize;
use tokio::sync::broadcast::{error::RecvError, Receiver};

use super::{ApiError, App, PathId};

/// How often an idle stream sends a comment, so proxies keep it open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// `GET /api/events/stream`: one `data:` JSON event per recorded event.
#[utoipa::path(get, path = "/api/events/stream", tag = "manage",
    responses(
        (status = 200, description = "The events kept so far, then each new one, as server-sent events (`event: lagged` with the count a slow reader missed)", content_type = "text/event-stream", body = String),
        (status = "4XX", description = "The request cannot be served as sent", body = super::schema::Error)
    ))]
pub(super) async fn events(
    State(app): State<Arc<App>>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let (past, feed) = app.sessions.subscribe_events();
    live(&app, past, feed)
}

/// `GET /api/sessions/{id}/logs/stream`: one `data:` JSON string per line.
#[utoipa::path(get, path = "/api/sessions/{id}/logs/stream", tag = "manage",
    params(("id" = String, Path, description = "A session id")),
    responses(
        (status = 200, description = "The session's output kept so far, then each new line, as server-sent events; ends with the session", content_type = "text/event-stream", body = String),
        (status = "4XX", description = "The request cannot be served as sent (no such session)", body = super::schema::Error)
    ))]
pub(super) async fn logs(
    State(app): State<Arc<App>>,
    PathId(id): PathId,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let session = app.sessions.by_id(&id).ok_or_else(|| {
        ApiError::not_found(format!(
            "no running session '{id}'; GET /api/sessions lists them"
        ))
    })?;
    let (past, feed) = match session.process() {
        Some(process) => process.log.subscribe(),
        None => {
            // In-process engines write to the host's own output: one line
            // says so, and a feed that ends with the session.
            let (tx, rx) = tokio::sync::broadcast::channel(1);
            drop(tx);
            (
                vec!["(the engine runs inside the host: its output is the host's)".into()],
                rx,
            )
        }
    };
    Ok(live(&app, past, feed))
}

/// `past`, then what `feed` brings, until it closes or the host shuts down.
fn live<T: Serialize + Clone + Send + 'static>(
    app: &App,
    past: Vec<T>,
    feed: Receiver<T>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let data = |item: &T| {
        Event::default().data(serde_json::to_string(item).expect("feed items serialize"))
    };
    let past: Vec<Result<Event, Infallible>> = past.iter().map(|i| Ok(data(i))).collect();
    let later = stream::unfold(feed, move |mut feed| async move {
        let event = match feed.recv().await {
            Ok(item) => data(&item),
            Err(RecvError::Lagged(missed)) => {
                Event::default().event("lagged").data(missed.to_string())
            }
            Err(RecvError::Closed) => return None,
        };
        Some((Ok(event), feed))
    });
    let closing = app.sessions.closing();
    let stream = stream::iter(past)
        .chain(later)
        .take_until(async move { closing.cancelled_owned().await });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}
