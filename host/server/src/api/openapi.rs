//! The OpenAPI 3.1 document, `GET /openapi.json`: the paths come from the
//! handlers' `#[utoipa::path]` attributes, the bodies from the types in
//! `schema.rs`.
//!
//! A test reads the router's routes from `mod.rs` and fails when one is
//! missing from the document (or the document lists one the router lacks).

use axum::Json;
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Hangar",
        description = "A host for local LLM inference engines: OpenAI- (chat, completions, responses) and Anthropic-compatible routes for \
clients, Ollama's API under /ollama, management routes for operators. When the host was started with an API key, every route but \
/health, /openapi.json and the /admin page's files needs `Authorization: Bearer KEY` (or `x-api-key: KEY`)."
    ),
    paths(
        super::manage::health,
        openapi_json,
        super::openai::models,
        super::openai::chat_completions,
        super::openai::completions,
        super::embeddings::embeddings,
        super::embeddings::rerank,
        super::messages::messages,
        super::responses::create,
        super::responses::retrieve,
        super::responses::remove,
        super::ollama::tags,
        super::ollama::show,
        super::ollama::chat,
        super::ollama::generate,
        super::ollama::ps,
        super::ollama::version,
        super::ollama::embed::embed,
        super::ollama::embed::embeddings,
        super::ollama::pull,
        super::ollama::push,
        super::ollama::create,
        super::ollama::copy,
        super::ollama::remove,
        super::ollama::blobs,
        super::manage::plugins,
        super::manage::resolve,
        super::manage::models,
        super::manage::rescan,
        super::manage::load,
        super::manage::unload,
        super::remove::remove,
        super::pull::start,
        super::pull::list,
        super::pull::status,
        super::pull::cancel,
        super::pull::events,
        super::hub::search,
        super::hub::model,
        super::settings::get_app,
        super::settings::put_app,
        super::settings::get_model,
        super::settings::put_model,
        super::settings::schema,
        super::manage::sessions,
        super::manage::logs,
        super::manage::events,
        super::live::events,
        super::live::logs,
        super::manage::metrics,
        super::admin::page,
        super::admin::script,
        super::admin::style,
    ),
    modifiers(&Keys)
)]
pub(super) struct Document;

/// The routes anyone may call when the host has an API key.
const OPEN: &[&str] = &[
    "/health",
    "/openapi.json",
    "/admin",
    "/admin/app.js",
    "/admin/style.css",
];

/// The API key, as `Authorization: Bearer KEY` or `x-api-key: KEY`: needed
/// by every route but [`OPEN`] when the host was started with one.
struct Keys;

impl utoipa::Modify for Keys {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{
            ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme,
        };
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        components.add_security_scheme(
            "x-api-key",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("x-api-key"))),
        );
        let key = |name: &str| SecurityRequirement::new::<_, [&str; 0], &str>(name, []);
        for (path, item) in doc.paths.paths.iter_mut() {
            let mut either = vec![key("bearer"), key("x-api-key")];
            if OPEN.contains(&path.as_str()) {
                either.insert(0, SecurityRequirement::default()); // none needed
            }
            for operation in [
                &mut item.get,
                &mut item.post,
                &mut item.put,
                &mut item.delete,
                &mut item.patch,
            ]
            .into_iter()
            .flatten()
            {
                operation.security = Some(either.clone());
            }
        }
    }
}

/// `GET /openapi.json`.
#[utoipa::path(get, path = "/openapi.json", tag = "meta",
    responses((status = 200, description = "This document (OpenAPI 3.1)", body = Object)))]
pub(super) async fn openapi_json() -> Json<utoipa::openapi::OpenApi> {
    Json(Document::openapi())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `(METHOD, path)` pairs the router in `mod.rs` serves, with
    /// Ollama's nested under their prefix.
    fn router_routes() -> Vec<(String, String)> {
        let source = include_str!("mod.rs");
        let body = &source[source.find("pub(crate) fn router").expect("the router")..];
        let mut routes = routes_in(body, "");
        let source = include_str!("ollama/mod.rs");
        let body = &source[source
            .find("pub(super) fn routes")
            .expect("Ollama's routes")..];
        let body = &body[..body.find("\n}\n").expect("the end of Ollama's routes")];
        routes.extend(routes_in(body, super::super::ollama::PREFIX));
        routes.sort();
        routes
    }

    /// The `(METHOD, prefix + path)` pairs of the `.route(` calls in `body`.
    fn routes_in(body: &str, prefix: &str) -> Vec<(String, String)> {
        let mut routes = Vec::new();
        for part in body.split(".route(").skip(1) {
            let path = format!("{prefix}{}", part.split('"').nth(1).expect("a route path"));
            // The handlers of this route: up to the next builder call.
            let handlers = part.split("\n        .").next().unwrap_or(part);
            for method in ["get", "post", "put", "delete", "patch"] {
                let calls = handlers.matches(&format!("{method}(")).count();
                let chained = handlers.matches(&format!(".{method}(")).count();
                if calls > 0 || chained > 0 {
                    routes.push((method.to_uppercase(), path.clone()));
                }
            }
        }
        routes.sort();
        routes
    }

    fn documented_routes() -> Vec<(String, String)> {
        let doc = serde_json::to_value(Document::openapi()).unwrap();
        let mut routes = Vec::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for method in item.as_object().unwrap().keys() {
                routes.push((method.to_uppercase(), path.clone()));
            }
        }
        routes.sort();
        routes
    }

    #[test]
    fn every_route_of_the_router_is_documented() {
        let router = router_routes();
        assert!(
            router.len() > 15,
            "read too few routes from mod.rs: {router:?}"
        );
        assert_eq!(router, documented_routes());
    }

    #[test]
    fn the_document_is_openapi_3_1() {
        let doc = serde_json::to_value(Document::openapi()).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        let max = &doc["components"]["schemas"]["MessagesRequest"]["properties"]["max_tokens"];
        assert_eq!(max["minimum"], 1, "{max}");
    }
}
