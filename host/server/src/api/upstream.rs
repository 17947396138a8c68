//! Waiting on an engine under the serving timeouts: each time one passes,
//! the engine is checked (see [`crate::supervisor::health`]); a busy engine
//! is waited for, a hung one is killed and the request fails with a 504
//! that says so.

use std::future::Future;
use std::sync::Arc;

use axum::http::StatusCode;

use super::ApiError;
use crate::sessions::{Session, Sessions};
use crate::supervisor::health::State;

/// What a request waits for.
#[derive(Debug, Clone, Copy)]
pub(super) enum Wait {
    /// The answer's first byte (its headers): `first_byte_timeout_ms`.
    FirstByte,
    /// More of an answer under way: `stream_idle_timeout_ms`.
    More,
}

/// Awaits `future` from `session`'s engine under the timeout for `wait`.
pub(super) async fn wait<F: Future>(
    sessions: &Arc<Sessions>,
    session: &Arc<Session>,
    wait: Wait,
    future: F,
) -> Result<F::Output, ApiError> {
    let Some(monitor) = &session.monitor else {
        return Ok(future.await);
    };
    let (period, what) = match wait {
        Wait::FirstByte => (
            monitor.settings().first_byte(),
            "while its answer was awaited",
        ),
        Wait::More => (
            monitor.settings().stream_idle(),
            "in the middle of its answer",
        ),
    };
    let hung = match monitor.watched(future, period, what).await {
        Ok(out) => return Ok(out),
        Err(hung) => hung,
    };
    monitor.set_final(State::Hung);
    let reason = format!(
        "engine '{}' serving model '{}' hung: it sent nothing for {:?} {} and did not answer a check within {:?}; it was killed, and the next request starts it afresh",
        session.plugin,
        session.model.id,
        hung.waited,
        hung.what,
        monitor.settings().check()
    );
    // Its own task, so that this request going away cannot cut the
    // cleanup short.
    let retire = tokio::spawn(
        sessions
            .clone()
            .retire(session.clone(), "hung", reason.clone()),
    );
    let _ = retire.await;
    Err(hung_error(reason))
}

/// The error for a request to an engine that hung: a 504.
pub(super) fn hung_error(reason: String) -> ApiError {
    ApiError {
        status: StatusCode::GATEWAY_TIMEOUT,
        code: "engine_hung",
        ..ApiError::engine(reason)
    }
}
