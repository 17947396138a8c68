//! API errors, in OpenAI's error shape:
//! `{"error": {"message", "type", "param", "code"}}`. Every message says
//! what happened and what to do.

use std::borrow::Cow;

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::scheduler::driver::AdmitError;
use crate::scheduler::machine::Refusal;
use crate::sessions::LoadError;

/// An error answer.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// OpenAI's `type`.
    pub kind: &'static str,
    /// OpenAI's `code`.
    pub code: &'static str,
    /// The sentence for the user.
    pub message: String,
    /// The request field concerned, if any: usually a name the route
    /// knows, but a field the client made up (an unknown one) is named as
    /// sent.
    pub param: Option<Cow<'static, str>>,
    /// Seconds after which a retry may succeed.
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(
        status: StatusCode,
        kind: &'static str,
        code: &'static str,
        message: String,
    ) -> ApiError {
        ApiError {
            status,
            kind,
            code,
            message,
            param: None,
            retry_after: None,
        }
    }

    /// 400: the request is malformed.
    pub(crate) fn bad_request(message: impl Into<String>, param: Option<&'static str>) -> ApiError {
        ApiError {
            param: param.map(Cow::Borrowed),
            ..ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "invalid_request",
                message.into(),
            )
        }
    }

    /// 400: the request has a field the route does not take, named in
    /// `param` as the client sent it.
    pub(crate) fn unknown_field(field: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(Cow::Owned(field.to_string())),
            ..ApiError::bad_request(message, None)
        }
    }

    /// 404: no such model.
    pub(crate) fn model_not_found(model: &str, available: &[String]) -> ApiError {
        let list = if available.is_empty() {
            "no models are installed; add model folders to a --model-dir".to_string()
        } else {
            format!("available: {}", available.join(", "))
        };
        ApiError {
            param: Some(Cow::Borrowed("model")),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "model_not_found",
                format!("model '{model}' does not exist ({list}); see GET /v1/models"),
            )
        }
    }

    /// 404 for anything else.
    pub(crate) fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "not_found",
            message.into(),
        )
    }

    /// 401: missing or wrong API key.
    pub(crate) fn unauthorized() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid_api_key",
            "missing or wrong API key; send 'Authorization: Bearer <key>' (or 'x-api-key: <key>') with the key hangar serve was started with".into(),
        )
    }

    /// 422: settings or request fields the engine cannot take.
    pub(crate) fn unprocessable(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request_error",
            "unsupported_setting",
            message.into(),
        )
    }

    /// 503: nothing can serve this now.
    pub(crate) fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "engine_error",
            "no_engine",
            message.into(),
        )
    }

    /// 500: the host failed.
    pub(crate) fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "host_error",
            message.into(),
        )
    }

    /// 502: the engine failed while serving.
    pub(crate) fn engine(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "engine_error",
            "engine_failed",
            message.into(),
        )
    }

    /// The error's JSON body.
    pub(crate) fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl From<LoadError> for ApiError {
    fn from(e: LoadError) -> ApiError {
        let (status, code) = match &e {
            LoadError::NoEngine { .. } => (StatusCode::SERVICE_UNAVAILABLE, "no_engine"),
            LoadError::Plan { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_model_settings"),
            LoadError::Start { .. } | LoadError::AllFailed { .. } => {
                (StatusCode::SERVICE_UNAVAILABLE, "engine_start_failed")
            }
            LoadError::Cancelled { .. } => (StatusCode::SERVICE_UNAVAILABLE, "load_cancelled"),
            LoadError::ShuttingDown { .. } => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down"),
            LoadError::Host { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "host_error"),
        };
        ApiError::new(status, "engine_error", code, e.to_string())
    }
}

impl From<Refusal> for ApiError {
    fn from(r: Refusal) -> ApiError {
        let (status, kind, code) = match &r {
            Refusal::QueueFull { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                "queue_full",
            ),
            Refusal::QueueTimeout { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                "queue_timeout",
            ),
            Refusal::Memory { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "insufficient_memory",
            ),
            Refusal::Pressure { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "memory_pressure",
            ),
            Refusal::TooManyModels { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "too_many_models",
            ),
            Refusal::Busy { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "models_busy",
            ),
        };
        ApiError {
            retry_after: r.retry_after(),
            ..ApiError::new(status, kind, code, r.to_string())
        }
    }
}

impl From<AdmitError> for ApiError {
    fn from(e: AdmitError) -> ApiError {
        match e {
            AdmitError::Refused(r) => r.into(),
            AdmitError::Load(e) => e.into(),
        }
    }
}

impl From<axum::extract::rejection::BytesRejection> for ApiError {
    fn from(e: axum::extract::rejection::BytesRejection) -> ApiError {
        let status = e.status();
        let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
            format!(
                "the request body is larger than {} MiB; send a smaller request",
                super::MAX_BODY_MIB
            )
        } else {
            format!("cannot read the request body: {e}")
        };
        ApiError {
            status,
            ..ApiError::bad_request(message, None)
        }
    }
}

impl From<axum::extract::rejection::PathRejection> for ApiError {
    fn from(e: axum::extract::rejection::PathRejection) -> ApiError {
        // Chiefly a segment whose percent-decoding is not UTF-8.
        ApiError::bad_request(
            format!(
                "bad path: {}; ids in paths are UTF-8, percent-encoded (`/` as %2F)",
                e.body_text()
            ),
            None,
        )
    }
}

impl From<axum::extract::rejection::QueryRejection> for ApiError {
    fn from(e: axum::extract::rejection::QueryRejection) -> ApiError {
        ApiError::bad_request(format!("bad query string: {}", e.body_text()), None)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if let Some(secs) = self.retry_after {
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                response.headers_mut().insert("retry-after", v);
            }
        }
        response
    }
}
