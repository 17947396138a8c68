//! Which plugin serves each format, resolved once and kept until the
//! settings change, so that a request does not run a resolution.
//!
//! The registry does not change while the host runs, and a plugin's engine
//! is loaded and probed once; the stored settings' default engines are the
//! only other input, and every settings write bumps the generation this
//! cache is checked against.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use hangar_engine::models::Needs;
use hangar_engine::registry::{Engine, EngineState, PluginEntry, Registry};

use crate::settings::SettingsStore;

/// Resolutions by format, for one settings generation.
#[derive(Default)]
pub(crate) struct Resolved {
    cache: Mutex<Cached>,
}

#[derive(Default)]
struct Cached {
    generation: u64,
    /// (Format, what the model needs of its engine) → the index in the
    /// registry of the plugin that serves it, or `None` when no plugin can
    /// (loading then says why).
    serving: HashMap<(String, Needs), Option<usize>>,
}

impl Resolved {
    /// The plugin and engine that serve `format`, if any; the first call
    /// for a format (and the first after a settings change) resolves it off
    /// the async threads, since resolution may load and probe plugins.
    pub(crate) async fn serving<'r>(
        &self,
        registry: &'r Arc<Registry>,
        settings: &Arc<SettingsStore>,
        format: &str,
        needs: Needs,
    ) -> Option<(&'r PluginEntry, &'r Engine)> {
        let generation = settings.generation();
        let hit = {
            let mut cached = self.cache.lock().expect("resolved lock");
            if cached.generation != generation {
                cached.generation = generation;
                cached.serving.clear();
            }
            cached
                .serving
                .get(&(format.to_string(), needs.clone()))
                .copied()
        };
        let index = match hit {
            Some(index) => index,
            None => {
                let (reg, defaults) = (registry.clone(), settings.get().default_engines);
                let (wanted, needed) = (format.to_string(), needs.clone());
                let index = tokio::task::spawn_blocking(move || {
                    let (entry, _) = reg.serving_except(&wanted, &needed, &defaults, &[]).ok()?;
                    reg.plugins().iter().position(|p| std::ptr::eq(p, entry))
                })
                .await
                .ok()
                .flatten();
                let mut cached = self.cache.lock().expect("resolved lock");
                // A settings write while resolving makes this one stale.
                if cached.generation == generation {
                    cached.serving.insert((format.to_string(), needs), index);
                }
                index
            }
        };
        let entry = &registry.plugins()[index?];
        match registry.engine(entry) {
            EngineState::Ready(engine) => Some((entry, engine)),
            _ => None,
        }
    }
}
