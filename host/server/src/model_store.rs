//! A model's place on disk: where models are read from, how many bytes one
//! takes, and removing it, for `hangar serve`, `hangar models`, `hangar rm`
//! and `GET`/`DELETE /api/models`.
//!
//! Models are read from the model dirs (`--model-dir`, then the config's
//! `model_dirs`) and from the Hugging Face cache that `hangar pull` fills
//! (`HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`,
//! as `huggingface_hub` resolves it), so that what was pulled is served
//! after a restart as it was before. `hf_cache = false` in `config.toml`
//! leaves the cache out.
//!
//! What is counted and removed depends on the layout the model was found in:
//!
//! - a **model file** (`q.gguf`) or **model folder** of a model dir: the file,
//!   or the folder's files; a folder or file linked in from elsewhere is the
//!   link alone when removed (its target is not the host's to delete);
//! - a **Hugging Face cache snapshot** (`models--ORG--NAME/snapshots/REV`):
//!   the blobs its links point at, each once. Removing it removes its links,
//!   the blobs no other snapshot of the repository still links to, the refs
//!   naming the revision, and the repository folder once no snapshot is left,
//!   as `hf cache delete` (`huggingface-cli delete-cache`) does.
//!
//! Nothing outside the model dirs is ever deleted: links are removed as
//! links, and a blob is deleted only when its real path lies in the
//! repository's own `blobs/`.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use hangar_engine::config::Config;
use hangar_engine::models::{Model, ModelSource};

/// The Hugging Face hub cache: `HF_HUB_CACHE`, else `HF_HOME/hub`, else
/// `~/.cache/huggingface/hub` (as `huggingface_hub` resolves it).
pub(crate) fn hf_cache_dir(
    hub_cache: Option<&str>,
    hf_home: Option<&str>,
    home: Option<&Path>,
) -> Option<PathBuf> {
    let set = |v: Option<&str>| v.filter(|v| !v.is_empty()).map(PathBuf::from);
    set(hub_cache)
        .or_else(|| set(hf_home).map(|h| h.join("hub")))
        .or_else(|| home.map(|h| h.join(".cache").join("huggingface").join("hub")))
}

/// [`hf_cache_dir`] of this process's environment, absolute: the cache
/// `hangar pull` fills; `None` only without any home folder.
pub(crate) fn hf_cache() -> Option<PathBuf> {
    let env = |k: &str| std::env::var(k).ok();
    let cache = hf_cache_dir(
        env("HF_HUB_CACHE").as_deref(),
        env("HF_HOME").as_deref(),
        dirs::home_dir().as_deref(),
    )?;
    Some(std::path::absolute(&cache).unwrap_or(cache))
}

/// Where models are read from.
#[derive(Debug, Clone)]
pub(crate) struct Sources {
    /// The model dirs: `--model-dir`, then the config's `model_dirs`;
    /// absolute, since engines run in their sessions' work folders.
    pub(crate) dirs: Vec<PathBuf>,
    /// The Hugging Face cache `hangar pull` fills, unless the config says
    /// `hf_cache = false`; it may not exist yet.
    pub(crate) hf_cache: Option<PathBuf>,
}

impl Sources {
    /// The sources of `extra` (`--model-dir`) and `config`, with the pull
    /// cache `hf_cache` names (`None`: none, or no home folder).
    pub(crate) fn new(extra: &[PathBuf], config: &Config, hf_cache: Option<PathBuf>) -> Sources {
        let dirs = extra
            .iter()
            .chain(&config.model_dirs)
            .map(|d| std::path::absolute(d).unwrap_or_else(|_| d.clone()))
            .collect();
        Sources {
            dirs,
            hf_cache: hf_cache.filter(|_| config.hf_cache),
        }
    }

    /// The folders to read now: the model dirs, then the pull cache when it
    /// exists and is not one of them (nor inside the Hugging Face home one
    /// of them names).
    pub(crate) fn scanned(&self) -> Vec<PathBuf> {
        let mut dirs = self.dirs.clone();
        if let Some(cache) = &self.hf_cache {
            if cache.is_dir() && !covers(&dirs, cache) {
                dirs.push(cache.clone());
            }
        }
        dirs
    }
}

/// Whether one of `dirs` is `cache`, or the Hugging Face home holding it
/// (discovery reads a dir's `hub/` in its place).
pub(crate) fn covers(dirs: &[PathBuf], cache: &Path) -> bool {
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    };
    dirs.iter()
        .any(|d| same(d, cache) || same(&d.join("hub"), cache))
}

/// What removing a model deletes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Removal {
    /// The files, links and folders to delete, in order (a folder after
    /// what it holds).
    pub paths: Vec<PathBuf>,
    /// The bytes freed: the files among `paths`, and what the folders among
    /// them hold, each file once (links count nothing).
    pub bytes: u64,
}

/// The bytes model `model` takes on disk: the files of its folder (each
/// real file once, wherever a link points), or its file.
pub(crate) fn size_on_disk(model: &Model) -> u64 {
    let mut seen = BTreeSet::new();
    let mut total = 0;
    count_files(&model.path, &mut seen, &mut total, 0);
    total
}

/// Adds to `total` the size of every real file under `path` (following
/// links) not yet in `seen`.
fn count_files(path: &Path, seen: &mut BTreeSet<PathBuf>, total: &mut u64, depth: usize) {
    // A link cycle would recurse for ever.
    if depth > 32 {
        return;
    }
    let Ok(meta) = fs::metadata(path) else {
        return;
    };
    if meta.is_dir() {
        let Ok(entries) = fs::read_dir(path) else {
            return;
        };
        for entry in entries.flatten() {
            count_files(&entry.path(), seen, total, depth + 1);
        }
    } else if meta.is_file() {
        let real = fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        if seen.insert(real) {
            *total += meta.len();
        }
    }
}

/// What removing `model` would delete, or why it may not be removed.
/// `model_dirs` are the dirs it was discovered in: a model outside them is
/// refused.
pub(crate) fn plan_removal(model: &Model, model_dirs: &[PathBuf]) -> Result<Removal, String> {
    let inside = model_dirs.iter().any(|dir| {
        let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.clone());
        let path = std::path::absolute(&model.path).unwrap_or_else(|_| model.path.clone());
        path.starts_with(&dir) && path != dir
    });
    if !inside {
        return Err(format!(
            "{} is not inside a model dir; hangar removes only what it found in its model dirs",
            model.path.display()
        ));
    }
    match &model.source {
        ModelSource::Folder => Ok(plan_entry(&model.path)),
        ModelSource::HfCache { revision, .. } => plan_snapshot(&model.path, revision),
    }
}

/// A model file or folder of a model dir: itself, or the link to it.
fn plan_entry(path: &Path) -> Removal {
    let linked = fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    let bytes = if linked {
        0
    } else {
        let mut total = 0;
        count_files_no_links(path, &mut total);
        total
    };
    Removal {
        paths: vec![path.to_path_buf()],
        bytes,
    }
}

/// Adds to `total` the size of every regular file under `path`, not
/// following links (they are removed as links).
fn count_files_no_links(path: &Path, total: &mut u64) {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return;
    };
    if meta.is_dir() {
        for entry in fs::read_dir(path).into_iter().flatten().flatten() {
            count_files_no_links(&entry.path(), total);
        }
    } else if meta.is_file() {
        *total += meta.len();
    }
}

/// A snapshot `snapshot` (`models--X/snapshots/REV`) of the Hugging Face
/// cache.
fn plan_snapshot(snapshot: &Path, revision: &str) -> Result<Removal, String> {
    let repo = snapshot
        .parent()
        .and_then(Path::parent)
        .filter(|r| {
            r.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("models--"))
        })
        .ok_or_else(|| {
            format!(
                "{} is not a snapshot of a Hugging Face cache folder (models--ORG--NAME/snapshots/REV)",
                snapshot.display()
            )
        })?;
    // A repository folder linked in from elsewhere is removed as the link.
    if fs::symlink_metadata(repo).is_ok_and(|m| m.file_type().is_symlink()) {
        return Ok(plan_entry(repo));
    }
    let blobs = fs::canonicalize(repo.join("blobs")).ok();
    let ours = linked_blobs(snapshot, blobs.as_deref());
    let others: Vec<PathBuf> = fs::read_dir(repo.join("snapshots"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.as_path() != snapshot && p.is_dir())
        .collect();
    if others.is_empty() {
        // The last snapshot: the whole repository folder goes.
        let mut total = 0;
        count_files_no_links(repo, &mut total);
        return Ok(Removal {
            paths: vec![repo.to_path_buf()],
            bytes: total,
        });
    }
    let mut kept = BTreeSet::new();
    for other in &others {
        kept.extend(linked_blobs(other, blobs.as_deref()));
    }
    let mut paths = Vec::new();
    let mut bytes = 0;
    for blob in ours.difference(&kept) {
        bytes += fs::metadata(blob).map(|m| m.len()).unwrap_or(0);
        paths.push(blob.clone());
    }
    // The refs naming this revision (`refs/main`, `refs/pr/1`).
    let mut refs = Vec::new();
    collect_refs(&repo.join("refs"), revision, &mut refs);
    paths.extend(refs);
    // Links and the files a snapshot may hold itself.
    count_files_no_links(snapshot, &mut bytes);
    paths.push(snapshot.to_path_buf());
    Ok(Removal { paths, bytes })
}

/// The real paths of the blobs that links under `dir` point at, among
/// those inside `blobs` (the repository's own blob folder).
fn linked_blobs(dir: &Path, blobs: Option<&Path>) -> BTreeSet<PathBuf> {
    let mut found = BTreeSet::new();
    let Some(blobs) = blobs else {
        return found;
    };
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            stack.extend(
                fs::read_dir(&path)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.path()),
            );
        } else if meta.file_type().is_symlink() {
            if let Ok(real) = fs::canonicalize(&path) {
                if real.parent() == Some(blobs) && real.is_file() {
                    found.insert(real);
                }
            }
        }
    }
    found
}

/// The ref files under `dir` that hold `revision`.
fn collect_refs(dir: &Path, revision: &str, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            collect_refs(&path, revision, out);
        } else if meta.is_file()
            && meta.len() < 4096
            && fs::read_to_string(&path).is_ok_and(|t| t.trim() == revision)
        {
            out.push(path);
        }
    }
}

/// Deletes what `removal` names: links and files as themselves, folders
/// with what they hold (without following links out of them).
pub(crate) fn remove(removal: &Removal) -> io::Result<()> {
    for path in &removal.paths {
        let meta = match fs::symlink_metadata(path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let result = if meta.is_dir() {
            // `remove_dir_all` removes links inside as links.
            fs::remove_dir_all(path)
        } else {
            fs::remove_file(path)
        };
        result.map_err(|e| {
            io::Error::new(e.kind(), format!("cannot remove {}: {e}", path.display()))
        })?;
    }
    Ok(())
}

/// Where a model was found, for `source` in `GET /api/models` and
/// `hangar models`: `model_dir` or `hf_cache`.
pub(crate) fn source_name(model: &Model) -> &'static str {
    match model.source {
        ModelSource::Folder => "model_dir",
        ModelSource::HfCache { .. } => "hf_cache",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;
    use hangar_engine::models::{builtin_rules, discover};
    use std::os::unix::fs::symlink;

    const SAFETENSORS: &[u8] = b"\x02\x00\x00\x00\x00\x00\x00\x00{}";

    /// A Hugging Face cache under `hub` with repository `org/m`: blob `a`
    /// (shared by both revisions), `b` (rev1 only), `c` (rev2 only); refs
    /// `main` → rev2 and `old` → rev1.
    fn cache(hub: &Path) -> PathBuf {
        let repo = hub.join("models--org--m");
        fs::create_dir_all(repo.join("blobs")).unwrap();
        fs::create_dir_all(repo.join("refs")).unwrap();
        fs::write(repo.join("blobs/a"), "{}").unwrap();
        fs::write(repo.join("blobs/b"), SAFETENSORS).unwrap();
        fs::write(repo.join("blobs/c"), [SAFETENSORS, b"  "].concat()).unwrap();
        for (rev, weights) in [("rev1", "b"), ("rev2", "c")] {
            let snap = repo.join("snapshots").join(rev);
            fs::create_dir_all(&snap).unwrap();
            symlink("../../blobs/a", snap.join("config.json")).unwrap();
            symlink(
                format!("../../blobs/{weights}"),
                snap.join("model.safetensors"),
            )
            .unwrap();
        }
        fs::write(repo.join("refs/main"), "rev2").unwrap();
        fs::write(repo.join("refs/old"), "rev1\n").unwrap();
        repo
    }

    fn model_at(path: &Path, revision: Option<&str>) -> Model {
        Model {
            id: "org/m".into(),
            path: path.to_path_buf(),
            format: "mlx".into(),
            source: match revision {
                Some(r) => ModelSource::HfCache {
                    repo: "org/m".into(),
                    revision: r.into(),
                },
                None => ModelSource::Folder,
            },
            size_bytes: 0,
            files: vec![],
            rule: String::new(),
            kind: Default::default(),
            model_type: None,
            vision: false,
        }
    }

    #[test]
    fn the_cache_is_found_as_the_hub_client_finds_it() {
        let home = Path::new("/home/u");
        let show = |c: Option<PathBuf>| c.map(|p| p.display().to_string()).unwrap_or("none".into());
        expect!["/c/hub-cache"].assert_eq(&show(hf_cache_dir(
            Some("/c/hub-cache"),
            Some("/h"),
            Some(home),
        )));
        expect!["/h/hub"].assert_eq(&show(hf_cache_dir(None, Some("/h"), Some(home))));
        expect!["/h/hub"].assert_eq(&show(hf_cache_dir(Some(""), Some("/h"), Some(home))));
        expect!["/home/u/.cache/huggingface/hub"].assert_eq(&show(hf_cache_dir(
            None,
            None,
            Some(home),
        )));
        expect!["none"].assert_eq(&show(hf_cache_dir(None, None, None)));
    }

    #[test]
    fn the_pull_cache_is_read_besides_the_model_dirs_unless_turned_off() {
        let temp = tempfile::tempdir().unwrap();
        let root = temp.path();
        let home = root.join("hf");
        let cache = home.join("hub");
        let scanned = |extra: &[&str], hf_cache: bool| -> String {
            let config = Config {
                model_dirs: vec![root.join("configured")],
                hf_cache,
                ..Config::default()
            };
            let extra: Vec<PathBuf> = extra.iter().map(|d| root.join(d)).collect();
            Sources::new(&extra, &config, Some(cache.clone()))
                .scanned()
                .iter()
                .map(|d| d.strip_prefix(root).unwrap().display().to_string())
                .collect::<Vec<_>>()
                .join(" ")
        };
        // Nothing pulled yet: no cache to read.
        expect!["flag configured"].assert_eq(&scanned(&["flag"], true));
        fs::create_dir_all(&cache).unwrap();
        expect!["flag configured hf/hub"].assert_eq(&scanned(&["flag"], true));
        expect!["flag configured"].assert_eq(&scanned(&["flag"], false));
        // A model dir that is the cache, or the Hugging Face home holding
        // it, reads it already.
        expect!["hf/hub configured"].assert_eq(&scanned(&["hf/hub"], true));
        expect!["hf configured"].assert_eq(&scanned(&["hf"], true));
    }

    #[test]
    fn a_snapshot_counts_its_blobs_once_and_not_its_links() {
        let temp = tempfile::tempdir().unwrap();
        let repo = cache(temp.path());
        // A second link to the same blob is not counted twice.
        symlink(
            "../../blobs/a",
            repo.join("snapshots/rev2/tokenizer_config.json"),
        )
        .unwrap();
        let found = discover(&[temp.path().to_path_buf()], &builtin_rules());
        let model = found.find("org/m").expect("the cache model is found");
        // rev2 (refs/main): a and c, the second link to a not counted again.
        assert_eq!(size_on_disk(model), 2 + 12);
    }

    #[test]
    fn removing_one_revision_keeps_the_blobs_another_still_uses() {
        let temp = tempfile::tempdir().unwrap();
        let repo = cache(temp.path());
        let model = model_at(&repo.join("snapshots/rev1"), Some("rev1"));
        let removal = plan_removal(&model, &[temp.path().to_path_buf()]).unwrap();
        let blobs = fs::canonicalize(repo.join("blobs")).unwrap();
        assert_eq!(
            removal.paths,
            [
                blobs.join("b"),
                repo.join("refs/old"),
                repo.join("snapshots/rev1")
            ]
        );
        assert_eq!(removal.bytes, 10);
        remove(&removal).unwrap();
        assert!(repo.join("blobs/a").exists(), "rev2 still links to a");
        assert!(repo.join("blobs/c").exists());
        assert!(!repo.join("blobs/b").exists());
        assert!(repo.join("refs/main").exists());
        assert!(!repo.join("snapshots/rev1").exists());
        // The other revision is still a model.
        let found = discover(&[temp.path().to_path_buf()], &builtin_rules());
        assert!(found.find("org/m").is_some());
    }

    #[test]
    fn removing_the_last_revision_removes_the_repository_folder() {
        let temp = tempfile::tempdir().unwrap();
        let repo = cache(temp.path());
        fs::remove_dir_all(repo.join("snapshots/rev1")).unwrap();
        let model = model_at(&repo.join("snapshots/rev2"), Some("rev2"));
        let removal = plan_removal(&model, &[temp.path().to_path_buf()]).unwrap();
        assert_eq!(removal.paths, std::slice::from_ref(&repo));
        // Every blob, the refs (4 + 5 bytes) included.
        assert_eq!(removal.bytes, 2 + 10 + 12 + 4 + 5);
        remove(&removal).unwrap();
        assert!(!repo.exists());
        assert!(temp.path().exists());
    }

    #[test]
    fn nothing_outside_the_model_dirs_is_removed() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path().join("models");
        let outside = temp.path().join("elsewhere");
        fs::create_dir_all(&dir).unwrap();
        fs::create_dir_all(outside.join("big")).unwrap();
        fs::write(outside.join("big/w.gguf"), "GGUF....").unwrap();
        fs::write(outside.join("keep.txt"), "x").unwrap();
        // A linked-in model folder, and a model folder holding a link out.
        symlink(outside.join("big"), dir.join("linked")).unwrap();
        fs::create_dir_all(dir.join("own")).unwrap();
        fs::write(dir.join("own/w.gguf"), "GGUF").unwrap();
        symlink(outside.join("keep.txt"), dir.join("own/notes.txt")).unwrap();

        let linked = plan_removal(
            &model_at(&dir.join("linked"), None),
            std::slice::from_ref(&dir),
        )
        .unwrap();
        assert_eq!(
            linked,
            Removal {
                paths: vec![dir.join("linked")],
                bytes: 0
            }
        );
        remove(&linked).unwrap();
        let own = plan_removal(
            &model_at(&dir.join("own"), None),
            std::slice::from_ref(&dir),
        )
        .unwrap();
        assert_eq!(own.bytes, 4, "the link out counts nothing");
        remove(&own).unwrap();

        assert!(!dir.join("linked").exists() && !dir.join("own").exists());
        assert!(outside.join("big/w.gguf").exists());
        assert!(outside.join("keep.txt").exists());
        // A model that is not in the dirs given is refused.
        let err = plan_removal(
            &model_at(&outside.join("big"), None),
            std::slice::from_ref(&dir),
        )
        .unwrap_err();
        assert!(err.contains("not inside a model dir"), "{err}");
    }

    #[test]
    fn a_model_file_is_the_file() {
        let temp = tempfile::tempdir().unwrap();
        fs::write(temp.path().join("q.gguf"), "GGUF1234").unwrap();
        fs::write(temp.path().join("r.gguf"), "GGUF").unwrap();
        let found = discover(&[temp.path().to_path_buf()], &builtin_rules());
        let q = found.find("q").expect("q.gguf is a model");
        assert_eq!(size_on_disk(q), 8);
        let removal = plan_removal(q, &[temp.path().to_path_buf()]).unwrap();
        assert_eq!(removal.paths, [temp.path().join("q.gguf")]);
        assert_eq!(removal.bytes, 8);
        remove(&removal).unwrap();
        let found = discover(&[temp.path().to_path_buf()], &builtin_rules());
        assert_eq!(
            found
                .models
                .iter()
                .map(|m| m.id.as_str())
                .collect::<Vec<_>>(),
            ["r"]
        );
    }

    #[test]
    fn a_cache_link_to_a_file_outside_blobs_is_removed_as_a_link() {
        let temp = tempfile::tempdir().unwrap();
        let repo = cache(temp.path());
        let outside = temp.path().join("outside.bin");
        fs::write(&outside, "precious").unwrap();
        symlink(&outside, repo.join("snapshots/rev1/extra.bin")).unwrap();
        let model = model_at(&repo.join("snapshots/rev1"), Some("rev1"));
        let removal = plan_removal(&model, &[temp.path().to_path_buf()]).unwrap();
        remove(&removal).unwrap();
        assert_eq!(fs::read_to_string(&outside).unwrap(), "precious");
    }
}
