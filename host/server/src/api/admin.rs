//! `GET /admin`: the operator's page (engines, models, sessions with live
//! logs and events, settings forms, a streaming chat), plain HTML, CSS and
//! JavaScript modules compiled into the binary: no build step, no files
//! to install. The page and its assets are public (they hold no data);
//! every call they make goes through the API and its key.

use axum::http::header;
use axum::response::{IntoResponse, Response};

/// The page.
const PAGE: &str = include_str!("admin/index.html");
/// Its script (an ES module).
const SCRIPT: &str = include_str!("admin/app.js");
/// Its styles.
const STYLE: &str = include_str!("admin/style.css");

/// Only the host's own assets and API: no inline script, nothing from
/// elsewhere.
const POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// `GET /admin`.
#[utoipa::path(get, path = "/admin", tag = "admin",
    responses((status = 200, description = "The admin page (public: it holds no data)", content_type = "text/html", body = String)))]
pub(super) async fn page() -> Response {
    asset("text/html; charset=utf-8", PAGE)
}

/// `GET /admin/app.js`.
#[utoipa::path(get, path = "/admin/app.js", tag = "admin",
    responses((status = 200, description = "The admin page's script (public: it holds no data)", content_type = "text/javascript", body = String)))]
pub(super) async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

/// `GET /admin/style.css`.
#[utoipa::path(get, path = "/admin/style.css", tag = "admin",
    responses((status = 200, description = "The admin page's style sheet (public: it holds no data)", content_type = "text/css", body = String)))]
pub(super) async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}
