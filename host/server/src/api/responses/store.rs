//! The stored responses of `/v1/responses`: one JSON file per response
//! under `<state dir>/responses/`, written through a temporary file and a
//! rename (a reader never sees half a response, a crash leaves at most a
//! `.tmp` file, removed at the next start), and bounded by count: past
//! [`Store::new`]'s limit the oldest is evicted.
//!
//! A record keeps the response object a client gets back from
//! `GET /v1/responses/{id}` and the conversation that led to it (every
//! input item of the chain of `previous_response_id`s, and this request's),
//! so that a follow-up needs one read, not a walk of the chain.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One stored response.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Record {
    /// The response object, as the client received it.
    pub response: Value,
    /// The conversation's input items before this response's output.
    pub input: Vec<Value>,
}

/// The store: files on disk, and their ids oldest first.
#[derive(Debug)]
pub(crate) struct Store {
    dir: PathBuf,
    limit: usize,
    order: Mutex<VecDeque<String>>,
}

/// How many responses are kept by default.
pub(crate) const LIMIT: usize = 1000;

impl Store {
    /// The store in `dir` (created at the first write), keeping at most
    /// `limit` responses; what an earlier run stored is kept, oldest first
    /// by modification time, and its leftover temporary files removed.
    pub(crate) fn new(dir: PathBuf, limit: usize) -> Store {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".tmp") {
                let _ = std::fs::remove_file(&path);
                continue;
            }
            let Some(id) = name.strip_suffix(".json").filter(|id| valid(id)) else {
                continue;
            };
            let modified = entry.metadata().and_then(|m| m.modified()).ok();
            found.push((modified, id.to_string()));
        }
        found.sort();
        let store = Store {
            dir,
            limit: limit.max(1),
            order: Mutex::new(found.into_iter().map(|(_, id)| id).collect()),
        };
        store.evict();
        store
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Stores `record` under `id`, evicting the oldest past the limit.
    pub(crate) fn put(&self, id: &str, record: &Record) -> std::io::Result<()> {
        if !valid(id) {
            return Err(std::io::Error::other(format!(
                "'{id}' is not a response id"
            )));
        }
        std::fs::create_dir_all(&self.dir)?;
        let text = serde_json::to_vec(record).map_err(std::io::Error::other)?;
        write_atomically(&self.path(id), &text)?;
        {
            let mut order = self.order.lock().unwrap_or_else(|e| e.into_inner());
            order.retain(|known| known != id);
            order.push_back(id.to_string());
        }
        self.evict();
        Ok(())
    }

    /// The record stored under `id`, if any.
    pub(crate) fn get(&self, id: &str) -> Option<Record> {
        if !valid(id) {
            return None;
        }
        let text = std::fs::read(self.path(id)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Removes the record under `id`; whether there was one.
    pub(crate) fn delete(&self, id: &str) -> bool {
        if !valid(id) {
            return false;
        }
        self.order
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|known| known != id);
        std::fs::remove_file(self.path(id)).is_ok()
    }

    /// Removes the oldest records past the limit.
    fn evict(&self) {
        let evicted: Vec<String> = {
            let mut order = self.order.lock().unwrap_or_else(|e| e.into_inner());
            let over = order.len().saturating_sub(self.limit);
            order.drain(..over).collect()
        };
        for id in evicted {
            let _ = std::fs::remove_file(self.path(&id));
        }
    }
}

/// Whether `id` can name a stored response: `resp_` and letters, digits,
/// `_` or `-` (so that no id reaches outside the store's folder).
fn valid(id: &str) -> bool {
    id.strip_prefix("resp_").is_some_and(|rest| {
        !rest.is_empty()
            && rest.len() <= 128
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    })
}

/// Writes `path` whole or not at all: a temporary file beside it, synced,
/// then renamed over it.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("json.tmp");
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn record(n: u64) -> Record {
        Record {
            response: json!({ "id": format!("resp_{n}"), "n": n }),
            input: vec![json!({ "type": "message", "role": "user", "content": "hi" })],
        }
    }

    fn files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn the_oldest_is_evicted_past_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().join("responses"), 2);
        for n in 1..=3 {
            store.put(&format!("resp_{n}"), &record(n)).unwrap();
        }
        assert_eq!(store.get("resp_1"), None);
        assert_eq!(store.get("resp_3"), Some(record(3)));
        assert_eq!(
            files(&dir.path().join("responses")),
            ["resp_2.json", "resp_3.json"]
        );
        // A new run keeps what is there, in order, and its own limit.
        drop(store);
        std::fs::write(dir.path().join("responses/resp_9.json.tmp"), b"{half").unwrap();
        let store = Store::new(dir.path().join("responses"), 1);
        assert_eq!(files(&dir.path().join("responses")), ["resp_3.json"]);
        assert!(store.get("resp_3").is_some());
    }

    #[test]
    fn delete_and_unknown_ids() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().to_path_buf(), 10);
        store.put("resp_a", &record(1)).unwrap();
        assert!(store.delete("resp_a"));
        assert!(!store.delete("resp_a"));
        assert_eq!(store.get("resp_a"), None);
        // Ids that could leave the folder are never looked up.
        assert_eq!(store.get("resp_../x"), None);
        assert!(store.put("../x", &record(1)).is_err());
        assert_eq!(files(dir.path()), Vec::<String>::new());
    }
}
