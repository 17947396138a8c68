//! Images that requests name by URL instead of sending their bytes: an
//! `image_url` part's `file:` URL is read from the folders `[images]
//! local_dirs` lists, an `http(s)` URL is fetched where `[images] remote`
//! allows it (from `remote_hosts` only, when listed), and each becomes the
//! `data:` URL every engine takes. So no engine ever reads a client's URL,
//! and every engine takes the same images.
//!
//! Done after the model is known to take images and before a slot is
//! taken; a refusal is a 400 naming the part, with what the operator can
//! change where the host's settings are the reason.

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use futures_util::StreamExt;
use hangar_engine::config::ImagesConfig;
use serde_json::{Map, Value};

use super::ApiError;

/// The most redirects a fetch follows.
const MAX_REDIRECTS: usize = 5;

/// How the client's request names its images, for refusals: by default
/// an OpenAI chat request's own paths (`messages[i].content[j].image_url.url`);
/// a translated request (Anthropic Messages, Responses) lists each image
/// part's path in the client's request, in the order the parts appear,
/// with the field its errors name as `param`.
#[derive(Debug, Clone, Default)]
pub(crate) struct ImageNames {
    pub(crate) param: Option<&'static str>,
    pub(crate) paths: Vec<String>,
}

impl ImageNames {
    /// The `k`-th image part, at `messages[i].content[j]` of the chat
    /// request: its path in the client's request, and the `param` field.
    fn of(&self, k: usize, i: usize, j: usize) -> (String, &'static str) {
        match (self.param, self.paths.get(k)) {
            (Some(param), Some(path)) => (path.clone(), param),
            _ => (
                format!("messages[{i}].content[{j}].image_url.url"),
                "messages",
            ),
        }
    }
}

/// `[images]` at work: the folders read (resolved) and the fetching client.
pub(crate) struct Images {
    config: ImagesConfig,
    /// `local_dirs`, absolute and with their links resolved.
    dirs: Vec<PathBuf>,
    client: reqwest::Client,
}

impl Images {
    /// Checks `config` against this machine: every folder of `local_dirs`
    /// must exist (a typo would otherwise refuse every image quietly).
    pub(crate) fn new(config: &ImagesConfig) -> anyhow::Result<Images> {
        let mut dirs = Vec::with_capacity(config.local_dirs.len());
        for dir in &config.local_dirs {
            let expanded = hangar_engine::config::expand_home(&dir.to_string_lossy());
            let resolved = std::fs::canonicalize(&expanded)
                .ok()
                .filter(|d| d.is_dir())
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "config.toml: [images] local_dirs has {}, which is not a folder on this machine; create it or remove it from the list",
                        dir.display()
                    )
                })?;
            dirs.push(resolved);
        }
        let hosts = config.remote_hosts.clone();
        let policy = reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= MAX_REDIRECTS {
                attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
            } else if !host_allowed(&hosts, attempt.url()) {
                let to = attempt.url().host_str().unwrap_or_default().to_string();
                attempt.error(format!(
                    "a redirect to {to}, which is not one of [images] remote_hosts"
                ))
            } else {
                attempt.follow()
            }
        });
        let client = reqwest::Client::builder()
            .redirect(policy)
            .timeout(Duration::from_millis(config.fetch_timeout_ms))
            .user_agent(concat!("hangar/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Images {
            config: config.clone(),
            dirs,
            client,
        })
    }

    /// Replaces every `file:` and `http(s)` image URL in `request`'s
    /// messages with a `data:` URL of the image's bytes. `data:` URLs stay.
    /// A refusal names each part as `names` says.
    pub(crate) async fn inline(
        &self,
        request: &mut Map<String, Value>,
        names: &ImageNames,
    ) -> Result<(), ApiError> {
        let Some(Value::Array(messages)) = request.get_mut("messages") else {
            return Ok(());
        };
        let mut k = 0;
        for (i, message) in messages.iter_mut().enumerate() {
            let Some(Value::Array(parts)) = message.get_mut("content") else {
                continue;
            };
            for (j, part) in parts.iter_mut().enumerate() {
                if part.get("type").and_then(Value::as_str) != Some("image_url") {
                    continue;
                }
                let (path, param) = names.of(k, i, j);
                k += 1;
                let Some(Value::String(url)) = part.pointer_mut("/image_url/url") else {
                    continue;
                };
                if url.starts_with("data:") {
                    continue;
                }
                let bytes = self.bytes(url).await.map_err(|why| {
                    ApiError::bad_request(format!("'{path}' ({url}) {why}"), Some(param))
                })?;
                let Some(kind) = image_type(&bytes) else {
                    return Err(ApiError::bad_request(
                        format!("'{path}' ({url}) is not a PNG, JPEG, GIF, WebP or BMP image"),
                        Some(param),
                    ));
                };
                let data = base64::engine::general_purpose::STANDARD.encode(&bytes);
                *url = format!("data:image/{kind};base64,{data}");
            }
        }
        Ok(())
    }

    /// The bytes `url` names, or why it is not read.
    async fn bytes(&self, url: &str) -> Result<Vec<u8>, String> {
        let parsed = reqwest::Url::parse(url).map_err(|e| format!("is not a URL: {e}"))?;
        match parsed.scheme() {
            "file" => self.file(&parsed).await,
            "http" | "https" => self.fetch(parsed).await,
            other => Err(format!(
                "is a {other}: URL; an image is a data: URL (data:image/png;base64,...), or a file: or http(s) URL where the operator allows them"
            )),
        }
    }

    /// A `file:` URL's file, from under one of the local dirs.
    async fn file(&self, url: &reqwest::Url) -> Result<Vec<u8>, String> {
        if self.dirs.is_empty() {
            return Err(
                "is a file: URL, and this host reads no files for clients; send the image's bytes as a data: URL (data:image/png;base64,...), or have the operator list the folder in [images] local_dirs of config.toml"
                    .into(),
            );
        }
        let path = url
            .to_file_path()
            .map_err(|()| "is not a local file's URL (file:///absolute/path)".to_string())?;
        let outside = || {
            format!(
                "names a file outside the folders this host reads images from ([images] local_dirs of config.toml: {})",
                self.dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
            )
        };
        // The path as written first, so that a file outside is refused
        // before anything tells whether it exists; then with its links
        // resolved, so that no link leads out.
        let written = lexical(&path).ok_or_else(outside)?;
        if !self.under_dirs(&written) {
            return Err(outside());
        }
        let resolved = tokio::fs::canonicalize(&written)
            .await
            .map_err(|e| format!("cannot be read: {e}"))?;
        if !self.under_dirs(&resolved) {
            return Err(outside());
        }
        let meta = tokio::fs::metadata(&resolved)
            .await
            .map_err(|e| format!("cannot be read: {e}"))?;
        if !meta.is_file() {
            return Err("is not a file".into());
        }
        self.within_limit(meta.len())?;
        tokio::fs::read(&resolved)
            .await
            .map_err(|e| format!("cannot be read: {e}"))
    }

    fn under_dirs(&self, path: &Path) -> bool {
        self.dirs.iter().any(|d| path.starts_with(d))
    }

    /// An `http(s)` URL's body, where remote images are allowed.
    async fn fetch(&self, url: reqwest::Url) -> Result<Vec<u8>, String> {
        if !self.config.remote {
            return Err(
                "is a remote URL, and this host fetches no images for clients; send the image's bytes as a data: URL (data:image/png;base64,...), or have the operator allow it with [images] remote = true in config.toml"
                    .into(),
            );
        }
        if !host_allowed(&self.config.remote_hosts, &url) {
            return Err(format!(
                "is on {}, which is not one of the hosts this host fetches images from ([images] remote_hosts: {})",
                url.host_str().unwrap_or_default(),
                self.config.remote_hosts.join(", ")
            ));
        }
        let failed = |e: reqwest::Error| {
            if e.is_timeout() {
                format!(
                    "was not fetched within {} ms ([images] fetch_timeout_ms)",
                    self.config.fetch_timeout_ms
                )
            } else {
                // The chain names the cause (refused, a DNS failure, the
                // redirect policy's reason).
                let mut why = e.to_string();
                let mut source = std::error::Error::source(&e);
                while let Some(cause) = source {
                    why = format!("{why}: {cause}");
                    source = cause.source();
                }
                format!("could not be fetched: {why}")
            }
        };
        let response = self.client.get(url).send().await.map_err(failed)?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!(
                "could not be fetched: its server answered {status}"
            ));
        }
        if let Some(length) = response.content_length() {
            self.within_limit(length)?;
        }
        let mut bytes = Vec::new();
        let mut body = response.bytes_stream();
        while let Some(chunk) = body.next().await {
            bytes.extend_from_slice(&chunk.map_err(failed)?);
            self.within_limit(bytes.len() as u64)?;
        }
        Ok(bytes)
    }

    fn within_limit(&self, len: u64) -> Result<(), String> {
        let max = self.config.max_mib << 20;
        match len > max {
            true => Err(format!(
                "is larger than the {} MiB this host takes for an image ([images] max_mib)",
                self.config.max_mib
            )),
            false => Ok(()),
        }
    }
}

/// Whether `url`'s host is one of `hosts` (all are, when none is listed).
fn host_allowed(hosts: &[String], url: &reqwest::Url) -> bool {
    hosts.is_empty()
        || url
            .host_str()
            .is_some_and(|h| hosts.iter().any(|allowed| allowed.eq_ignore_ascii_case(h)))
}

/// `path` with `.` and `..` taken out as written (no link followed), or
/// `None` where `..` would climb above the root.
fn lexical(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                if !out.pop() || out.as_os_str().is_empty() {
                    return None;
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Some(out)
}

/// An image's type from its signature (its first bytes).
pub(super) fn image_type(bytes: &[u8]) -> Option<&'static str> {
    Some(match bytes {
        [0x89, b'P', b'N', b'G', ..] => "png",
        [0xFF, 0xD8, 0xFF, ..] => "jpeg",
        [b'G', b'I', b'F', b'8', ..] => "gif",
        [b'R', b'I', b'F', b'F', _, _, _, _, b'W', b'E', b'B', b'P', ..] => "webp",
        [b'B', b'M', ..] => "bmp",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use expect_test::expect;
    use serde_json::json;

    use super::*;

    const PNG: &[u8] = b"\x89PNG\r\n\x1a\nrest";

    /// The verdict on each URL, as a chat part of a request.
    async fn verdicts(images: &Images, urls: &[String]) -> String {
        let mut lines = Vec::new();
        for url in urls {
            let mut request = json!({"messages": [{"role": "user", "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": url}},
            ]}]});
            let request = request.as_object_mut().unwrap();
            lines.push(match images.inline(request, &ImageNames::default()).await {
                Ok(()) => {
                    let url = request["messages"][0]["content"][1]["image_url"]["url"]
                        .as_str()
                        .unwrap()
                        .to_string();
                    format!("ok {url}")
                }
                Err(e) => format!("{} {:?}: {}", e.status.as_u16(), e.param, e.message),
            });
        }
        lines.join("\n")
    }

    #[tokio::test]
    async fn files_are_read_from_the_local_dirs_only() {
        let root = tempfile::tempdir().unwrap();
        let root_path = std::fs::canonicalize(root.path()).unwrap();
        let pictures = root_path.join("pictures");
        std::fs::create_dir_all(pictures.join("sub")).unwrap();
        std::fs::write(pictures.join("sub/cat.png"), PNG).unwrap();
        std::fs::write(pictures.join("notes.txt"), "hello").unwrap();
        std::fs::write(pictures.join("big.png"), vec![0x89; (1 << 20) + 1]).unwrap();
        std::fs::write(root_path.join("secret.png"), PNG).unwrap();
        std::os::unix::fs::symlink(root_path.join("secret.png"), pictures.join("link.png"))
            .unwrap();
        let config = ImagesConfig {
            local_dirs: vec![pictures.clone()],
            max_mib: 1,
            ..ImagesConfig::default()
        };
        let images = Images::new(&config).unwrap();
        let at = |p: &str| format!("file://{}/{p}", root_path.display());
        let shown = verdicts(
            &images,
            &[
                at("pictures/sub/cat.png"),
                at("pictures/sub/../sub/./cat.png"),
                at("pictures/missing.png"),
                at("pictures/notes.txt"),
                at("pictures/big.png"),
                at("pictures/sub"),
                at("secret.png"),
                at("pictures/../secret.png"),
                at("pictures/link.png"),
                at("missing-outside.png"),
                "file://server/share/cat.png".into(),
                "ftp://example.com/cat.png".into(),
                "https://example.com/cat.png".into(),
            ],
        )
        .await
        .replace(&root_path.display().to_string(), "ROOT");
        expect![[r#"
            ok data:image/png;base64,iVBORw0KGgpyZXN0
            ok data:image/png;base64,iVBORw0KGgpyZXN0
            400 Some("messages"): 'messages[0].content[1].image_url.url' (file://ROOT/pictures/missing.png) cannot be read: No such file or directory (os error 2)
            400 Some("messages"): 'messages[0].content[1].image_url.url' (file://ROOT/pictures/notes.txt) is not a PNG, JPEG, GIF, WebP or BMP image
            400 Some("messages"): 'messages[0].content[1].image_url.url' (file://ROOT/pictures/big.png) is larger than the 1 MiB this host takes for an image ([images] max_mib)
            400 Some("messages"): 'messages[0].content[1].image_url.url' (file://ROOT/pictures/sub) is not a file
            400 Some("messages"): 'messages[0].content[1].image_url.url' (file://ROOT/secret.png) names a file outside the folders this host reads images from ([images] local_dirs of config.toml: ROOT/pictures)
            400 Some("messages"): 'messages[0].content[1].image_url.url' (file://ROOT/pictures/../secret.png) names a file outside the folders this host reads images from ([images] local_dirs of config.toml: ROOT/pictures)
            400 Some("messages"): 'messages[0].content[1].image_url.url' (file://ROOT/pictures/link.png) names a file outside the folders this host reads images from ([images] local_dirs of config.toml: ROOT/pictures)
            400 Some("messages"): 'messages[0].content[1].image_url.url' (file://ROOT/missing-outside.png) names a file outside the folders this host reads images from ([images] local_dirs of config.toml: ROOT/pictures)
            400 Some("messages"): 'messages[0].content[1].image_url.url' (file://server/share/cat.png) is not a local file's URL (file:///absolute/path)
            400 Some("messages"): 'messages[0].content[1].image_url.url' (ftp://example.com/cat.png) is a ftp: URL; an image is a data: URL (data:image/png;base64,...), or a file: or http(s) URL where the operator allows them
            400 Some("messages"): 'messages[0].content[1].image_url.url' (https://example.com/cat.png) is a remote URL, and this host fetches no images for clients; send the image's bytes as a data: URL (data:image/png;base64,...), or have the operator allow it with [images] remote = true in config.toml"#]]
        .assert_eq(&shown);
    }

    #[tokio::test]
    async fn without_local_dirs_no_file_is_read_and_a_missing_dir_stops_the_start() {
        let images = Images::new(&ImagesConfig::default()).unwrap();
        expect![[r#"400 Some("messages"): 'messages[0].content[1].image_url.url' (file:///etc/hostname) is a file: URL, and this host reads no files for clients; send the image's bytes as a data: URL (data:image/png;base64,...), or have the operator list the folder in [images] local_dirs of config.toml"#]]
        .assert_eq(&verdicts(&images, &["file:///etc/hostname".into()]).await);
        let config = ImagesConfig {
            local_dirs: vec!["/no/such/folder".into()],
            ..ImagesConfig::default()
        };
        let error = Images::new(&config).err().unwrap().to_string();
        expect!["config.toml: [images] local_dirs has /no/such/folder, which is not a folder on this machine; create it or remove it from the list"]
            .assert_eq(&error);
    }

    /// A server on loopback answering `/cat.png` (a PNG), `/big` (2 MiB,
    /// no length given), `/slow` (after 2 s), `/gone` (404), `/text` (not
    /// an image), `/hop` (a redirect to `/cat.png`) and `/away` (a
    /// redirect to `localhost`, another host name). Its address.
    async fn image_server() -> String {
        use axum::response::{IntoResponse, Redirect};
        use axum::routing::get;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let app = axum::Router::new()
            .route("/cat.png", get(|| async { PNG.to_vec() }))
            .route(
                "/big",
                get(|| async {
                    let chunks = (0..32).map(|_| Ok::<_, std::io::Error>(vec![0x89u8; 1 << 16]));
                    axum::body::Body::from_stream(futures_util::stream::iter(chunks))
                }),
            )
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    PNG.to_vec()
                }),
            )
            .route(
                "/gone",
                get(|| async { axum::http::StatusCode::NOT_FOUND.into_response() }),
            )
            .route("/text", get(|| async { "hello" }))
            .route("/hop", get(|| async { Redirect::temporary("/cat.png") }))
            .route(
                "/away",
                get(move || async move {
                    Redirect::temporary(&format!("http://localhost:{port}/cat.png"))
                }),
            );
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://127.0.0.1:{port}")
    }

    #[tokio::test]
    async fn remote_images_are_fetched_where_allowed_within_limits() {
        let base = image_server().await;
        let config = ImagesConfig {
            remote: true,
            remote_hosts: vec!["127.0.0.1".into()],
            max_mib: 1,
            fetch_timeout_ms: 500,
            ..ImagesConfig::default()
        };
        let images = Images::new(&config).unwrap();
        let urls: Vec<String> = ["cat.png", "hop", "big", "slow", "gone", "text", "away"]
            .iter()
            .map(|p| format!("{base}/{p}"))
            .collect();
        let port = base.rsplit(':').next().unwrap();
        let shown = verdicts(&images, &urls).await.replace(port, "PORT");
        expect![[r#"
            ok data:image/png;base64,iVBORw0KGgpyZXN0
            ok data:image/png;base64,iVBORw0KGgpyZXN0
            400 Some("messages"): 'messages[0].content[1].image_url.url' (http://127.0.0.1:PORT/big) is larger than the 1 MiB this host takes for an image ([images] max_mib)
            400 Some("messages"): 'messages[0].content[1].image_url.url' (http://127.0.0.1:PORT/slow) was not fetched within 500 ms ([images] fetch_timeout_ms)
            400 Some("messages"): 'messages[0].content[1].image_url.url' (http://127.0.0.1:PORT/gone) could not be fetched: its server answered 404 Not Found
            400 Some("messages"): 'messages[0].content[1].image_url.url' (http://127.0.0.1:PORT/text) is not a PNG, JPEG, GIF, WebP or BMP image
            400 Some("messages"): 'messages[0].content[1].image_url.url' (http://127.0.0.1:PORT/away) could not be fetched: error following redirect for url (http://127.0.0.1:PORT/away): a redirect to localhost, which is not one of [images] remote_hosts"#]]
        .assert_eq(&shown);
        // A host not listed is not asked at all.
        let other = format!("http://localhost:{port}/cat.png");
        expect![[r#"400 Some("messages"): 'messages[0].content[1].image_url.url' (http://localhost:PORT/cat.png) is on localhost, which is not one of the hosts this host fetches images from ([images] remote_hosts: 127.0.0.1)"#]]
        .assert_eq(&verdicts(&images, &[other]).await.replace(port, "PORT"));
    }
}
