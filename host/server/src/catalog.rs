//! The model catalog: the models of the model dirs, held in memory so that
//! no request scans the disk.
//!
//! The catalog is scanned at start, again shortly after anything changes
//! under a model dir (a filesystem watch, debounced, so that a download
//! writing for minutes costs one scan after it settles), and on
//! `POST /api/models/rescan` (for what a watch cannot see: model folders
//! linked in from elsewhere, network filesystems, dirs created after the
//! start).
//!
//! Besides the model dirs it reads the Hugging Face cache that pulls fill
//! ([`crate::model_store::Sources`]); a cache that does not exist yet is
//! no error, and is read (and watched) from the first scan that finds it,
//! as after the first `hangar pull`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use hangar_engine::models::{Discovery, Rule};
use notify::Watcher as _;

use crate::model_store::Sources;
use crate::toolcall::ChatTraits;

/// How long the model dirs must stay quiet before a change is scanned.
const SETTLE: Duration = Duration::from_millis(300);

/// The models of the model dirs, as last scanned.
pub(crate) struct Catalog {
    /// The model dirs, and any cache a pull filled outside them.
    dirs: RwLock<Vec<PathBuf>>,
    /// The pull cache, read once it exists (unless the config turned it
    /// off).
    hf_cache: Option<PathBuf>,
    /// The recognition rules (the registry's), fixed for the host's life.
    rules: Vec<Rule>,
    current: RwLock<Arc<Discovery>>,
    /// What each model's chat template says about tools and reasoning, by
    /// model id (read with the scan, so that no request reads a template).
    chats: RwLock<Arc<HashMap<String, ChatTraits>>>,
    /// Each model's bytes on disk, by model id (counted with the scan, so
    /// that no request walks the disk).
    sizes: RwLock<Arc<HashMap<String, u64>>>,
    /// Serialises scans, so that a slow scan never replaces a newer one.
    scanning: Mutex<()>,
    /// The filesystem watch, while there is one.
    watcher: Mutex<Option<notify::RecommendedWatcher>>,
}

impl Catalog {
    /// Scans `sources` (blocking) with `rules` and returns the catalog of
    /// what was found.
    pub(crate) fn open(sources: Sources, rules: Vec<Rule>) -> Arc<Catalog> {
        let catalog = Arc::new(Catalog {
            dirs: RwLock::new(sources.dirs),
            hf_cache: sources.hf_cache,
            rules,
            current: RwLock::new(Arc::default()),
            chats: RwLock::new(Arc::default()),
            sizes: RwLock::new(Arc::default()),
            scanning: Mutex::new(()),
            watcher: Mutex::new(None),
        });
        catalog.scan();
        catalog
    }

    /// The models as last scanned.
    pub(crate) fn current(&self) -> Arc<Discovery> {
        self.current.read().expect("catalog lock").clone()
    }

    /// What model `id`'s chat template says (nothing known when it has
    /// none the host can read).
    pub(crate) fn chat(&self, id: &str) -> ChatTraits {
        let chats = self.chats.read().expect("catalog lock").clone();
        chats.get(id).cloned().unwrap_or_default()
    }

    /// The bytes model `id` takes on disk, as of the last scan
    /// ([`crate::model_store::size_on_disk`]).
    pub(crate) fn size_on_disk(&self, id: &str) -> Option<u64> {
        self.sizes.read().expect("catalog lock").get(id).copied()
    }

    /// The folders read: the model dirs, and the pull cache once it
    /// exists.
    pub(crate) fn dirs(&self) -> Vec<PathBuf> {
        self.dirs.read().expect("catalog lock").clone()
    }

    /// The pull cache the catalog reads by itself (`None` when the config
    /// turned that off).
    pub(crate) fn hf_cache(&self) -> Option<&Path> {
        self.hf_cache.as_deref()
    }

    /// Makes the catalog read `cache` (a Hugging Face cache a pull filled)
    /// from the next scan on, and watch it, unless a model dir is that
    /// cache or the Hugging Face home holding it; returns whether it was
    /// added.
    pub(crate) fn read_too(&self, cache: PathBuf) -> bool {
        let mut dirs = self.dirs.write().expect("catalog lock");
        if crate::model_store::covers(&dirs, &cache) {
            return false;
        }
        if let Some(watcher) = self.watcher.lock().expect("watcher lock").as_mut() {
            if let Err(e) = watcher.watch(&cache, notify::RecursiveMode::Recursive) {
                tracing::warn!(dir = %cache.display(), "cannot watch the pull cache ({e}); POST /api/models/rescan picks up its changes");
            }
        }
        dirs.push(cache);
        true
    }

    /// Scans the model dirs again (off the async threads) and returns what
    /// was found.
    pub(crate) async fn rescan(self: &Arc<Self>) -> Arc<Discovery> {
        let catalog = self.clone();
        match tokio::task::spawn_blocking(move || catalog.scan()).await {
            Ok(discovery) => discovery,
            Err(_) => self.current(),
        }
    }

    /// The one place the model dirs are read.
    fn scan(&self) -> Arc<Discovery> {
        let _one_at_a_time = self.scanning.lock().expect("scan lock");
        // The pull cache may have appeared since the last scan (the first
        // `hangar pull` makes it).
        if let Some(cache) = self.hf_cache.as_ref().filter(|c| c.is_dir()) {
            self.read_too(cache.clone());
        }
        let discovery = Arc::new(hangar_engine::models::discover(&self.dirs(), &self.rules));
        let chats: HashMap<String, ChatTraits> = discovery
            .models
            .iter()
            .filter_map(|m| {
                let template = hangar_engine::models::chat_template(m)?;
                Some((m.id.clone(), ChatTraits::of_template(&template)))
            })
            .collect();
        let sizes: HashMap<String, u64> = discovery
            .models
            .iter()
            .map(|m| (m.id.clone(), crate::model_store::size_on_disk(m)))
            .collect();
        *self.sizes.write().expect("catalog lock") = Arc::new(sizes);
        *self.chats.write().expect("catalog lock") = Arc::new(chats);
        *self.current.write().expect("catalog lock") = discovery.clone();
        discovery
    }

    /// Rescans whenever something changes under a model dir, until the
    /// catalog is dropped. A dir that cannot be watched (missing, or out of
    /// inotify watches) is logged and left to `POST /api/models/rescan`.
    pub(crate) fn watch(self: &Arc<Self>) {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
        let handler = move |event: notify::Result<notify::Event>| {
            // Reads (our own scans open files) are not changes.
            if let Ok(event) = event {
                if !matches!(event.kind, notify::EventKind::Access(_)) {
                    let _ = tx.try_send(());
                }
            }
        };
        let mut watcher = match notify::recommended_watcher(handler) {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(
                    "cannot watch the model dirs ({e}); POST /api/models/rescan picks up changes"
                );
                return;
            }
        };
        for dir in &self.dirs() {
            if let Err(e) = watcher.watch(dir, notify::RecursiveMode::Recursive) {
                tracing::warn!(dir = %dir.display(), "cannot watch model dir ({e}); POST /api/models/rescan picks up its changes");
            }
        }
        *self.watcher.lock().expect("watcher lock") = Some(watcher);
        let catalog = Arc::downgrade(self);
        tokio::spawn(async move {
            while rx.recv().await.is_some() {
                // Debounce: scan once the dirs have been quiet for SETTLE.
                while tokio::time::timeout(SETTLE, rx.recv())
                    .await
                    .is_ok_and(|e| e.is_some())
                {}
                let Some(catalog) = catalog.upgrade() else {
                    return;
                };
                let found = catalog.rescan().await;
                tracing::info!(
                    models = found.models.len(),
                    "model dirs changed; catalog rescanned"
                );
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(discovery: &Discovery) -> Vec<&str> {
        discovery.models.iter().map(|m| m.id.as_str()).collect()
    }

    #[tokio::test]
    async fn the_catalog_follows_the_model_dirs_without_rescanning_per_read() {
        let temp = tempfile::tempdir().unwrap();
        std::fs::write(temp.path().join("a.gguf"), "GGUF").unwrap();
        let catalog = Catalog::open(
            Sources {
                dirs: vec![temp.path().to_path_buf()],
                hf_cache: None,
            },
            hangar_engine::models::builtin_rules(),
        );
        assert_eq!(ids(&catalog.current()), ["a"]);
        // Reading is not scanning: a new file shows only after a rescan.
        std::fs::write(temp.path().join("b.gguf"), "GGUF").unwrap();
        assert_eq!(ids(&catalog.current()), ["a"]);
        let rescanned = catalog.rescan().await;
        assert_eq!(ids(&rescanned), ["a", "b"]);
        // The watch rescans on its own once the dir settles.
        catalog.watch();
        std::fs::write(temp.path().join("c.gguf"), "GGUF").unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while ids(&catalog.current()) != ["a", "b", "c"] {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the watch did not pick up c.gguf: {:?}",
                ids(&catalog.current())
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn the_pull_cache_is_read_and_watched_once_it_exists() {
        let temp = tempfile::tempdir().unwrap();
        let models = temp.path().join("models");
        std::fs::create_dir(&models).unwrap();
        let cache = temp.path().join("hf").join("hub");
        let catalog = Catalog::open(
            Sources {
                dirs: vec![models.clone()],
                hf_cache: Some(cache.clone()),
            },
            hangar_engine::models::builtin_rules(),
        );
        catalog.watch();
        // No cache yet (nothing was pulled): no error, nothing read.
        assert!(catalog.current().rejected.is_empty());
        assert_eq!(catalog.dirs(), std::slice::from_ref(&models));
        // The first pull makes it; the next scan reads it, and watches it.
        std::fs::create_dir_all(&cache).unwrap();
        std::fs::write(cache.join("a.gguf"), "GGUF").unwrap();
        let rescanned = catalog.rescan().await;
        assert_eq!(ids(&rescanned), ["a"]);
        assert_eq!(catalog.dirs(), [models, cache.clone()]);
        std::fs::write(cache.join("b.gguf"), "GGUF").unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while ids(&catalog.current()) != ["a", "b"] {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the watch did not pick up b.gguf in the cache: {:?}",
                ids(&catalog.current())
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A pull's own call finds it read already.
        assert!(!catalog.read_too(cache));
    }
}
