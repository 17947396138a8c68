//! The operator's configuration: `config.toml` in the config dir.
//!
//! ```toml
//! plugins_dirs = ["/opt/hangar/plugins"]   # besides the data dir's plugins/
//! model_dirs = ["~/models"]
//! hf_cache = false                         # don't read the Hugging Face cache
//! platform = "linux/x86_64/cpu"            # override detection
//!
//! [plugins.mlx-lm]                         # settings handed to one plugin
//! program = "/opt/venv/bin/python3"        # where its probe program lives
//! allow_programs = ["python3"]             # shells and interpreters it may run
//!
//! [clusters.pair]                          # machines one model may span
//! port = 32323                             # ranks talk on port, port+1, …
//! peers = [
//!   { name = "here",  ssh = "127.0.0.1", ip = "10.0.0.1" },  # this machine: rank 0
//!   { name = "there", ssh = "me@studio", ip = "10.0.0.2" },  # reached by ssh
//! ]
//!
//! [wasm]                                   # WebAssembly plugins
//! call_timeout_ms = 2000                   # each call's deadline
//! memory_mib = 64                          # each instance's memory cap
//! cache_dir = "~/.cache/hangar/wasm"       # compiled plugins
//!
//! [images]                                 # images that requests name by URL
//! local_dirs = ["~/Pictures"]              # file: URLs read under these only
//! remote = true                            # fetch http(s) URLs for clients
//! remote_hosts = ["images.example.com"]    # and only from these (empty: any)
//! max_mib = 20                             # the largest image read or fetched
//! fetch_timeout_ms = 10000                 # a fetch's deadline, redirects included
//! ```
//!
//! Settings (generation defaults, default engines, engine and model
//! settings) live beside it in `settings.toml`, which the server reads.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub const ALLOW_PROGRAMS: &str = "allow_programs";

/// The environment variable naming the config file.
pub const CONFIG_ENV: &str = "HANGAR_CONFIG";

/// The parsed configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Extra plugin folders, searched after `--plugins-dir` and before the
    /// data dir's `plugins/`.
    #[serde(default)]
    pub plugins_dirs: Vec<PathBuf>,
    /// Folders whose subfolders are models.
    #[serde(default)]
    pub model_dirs: Vec<PathBuf>,
    /// Whether the Hugging Face cache that `hangar pull` fills
    /// (`HF_HUB_CACHE`, else `HF_HOME/hub`, else
    /// `~/.cache/huggingface/hub`) is read as a model dir too, so that a
    /// pulled model is served after a restart without listing the cache in
    /// `model_dirs`. On by default; `false` serves the model dirs alone.
    #[serde(default = "on")]
    pub hf_cache: bool,
    /// Overrides platform detection (`os/arch/acc,acc`).
    #[serde(default)]
    pub platform: Option<String>,
    /// Plugin id → that plugin's settings (`program`, `allow_programs`,
    /// and whatever the plugin reads).
    #[serde(default)]
    pub plugins: BTreeMap<String, BTreeMap<String, serde_json::Value>>,
    /// The WebAssembly runtime: limits of each call into a plugin, and where
    /// compiled plugins are cached.
    #[serde(default)]
    pub wasm: WasmConfig,
    /// Named groups of machines that one model may be spread over by its
    /// engine's distributed runtime (a model's `cluster` setting names
    /// one).
    #[serde(default)]
    pub clusters: BTreeMap<String, ClusterConfig>,
    /// Images that requests give by reference (`file:` and `http(s)` URLs
    /// in `image_url` parts) rather than inline: which ones the host reads
    /// or fetches for a client. None by default.
    #[serde(default)]
    pub images: ImagesConfig,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            plugins_dirs: Vec::new(),
            model_dirs: Vec::new(),
            hf_cache: true,
            platform: None,
            plugins: BTreeMap::new(),
            wasm: WasmConfig::default(),
            clusters: BTreeMap::new(),
            images: ImagesConfig::default(),
        }
    }
}

fn on() -> bool {
    true
}

/// A `[clusters.NAME]` table: the peers in rank order and the ranks' port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// The machines; the first is this one (rank 0 serves HTTP here).
    pub peers: Vec<PeerConfig>,
    /// The first port the ranks listen on for each other (`port + rank`);
    /// the firewall between peers must let these through.
    #[serde(default = "default_cluster_port")]
    pub port: u16,
}

/// One peer of a cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerConfig {
    /// Its name (shown with its rank in `/api/sessions`); default: `ssh`.
    #[serde(default)]
    pub name: Option<String>,
    /// The `ssh` destination (`user@host`, an alias of `~/.ssh/config`);
    /// `127.0.0.1` is this machine.
    pub ssh: String,
    /// The IP address the other ranks reach it on.
    pub ip: String,
}

/// The ring backend's default first port (`mlx.launch --starting-port`).
fn default_cluster_port() -> u16 {
    32323
}

impl ClusterConfig {
    /// The cluster as a plugin sees it.
    pub fn to_wire(
        &self,
        name: &str,
        mode: hangar_plugin_api::wire::DistributedMode,
    ) -> hangar_plugin_api::wire::Cluster {
        hangar_plugin_api::wire::Cluster::new(
            name.to_string(),
            mode,
            self.peers
                .iter()
                .map(|p| {
                    let name = p.name.clone().unwrap_or_else(|| p.ssh.clone());
                    let mut peer = hangar_plugin_api::wire::Peer::new(name, &p.ssh, &p.ip);
                    peer.local = p.ssh == LOCAL_PEER;
                    peer
                })
                .collect(),
            self.port,
        )
    }

    /// What is wrong with `[clusters.NAME]`, if anything.
    fn check(&self, name: &str) -> Result<(), String> {
        let at = format!("[clusters.{name}]");
        if self.peers.len() < 2 {
            return Err(format!(
                "{at} has {} peer(s); a cluster needs at least two (this machine first, ssh = \"{LOCAL_PEER}\")",
                self.peers.len()
            ));
        }
        if self.peers[0].ssh != LOCAL_PEER {
            return Err(format!(
                "{at}'s first peer is '{}'; it must be this machine (ssh = \"{LOCAL_PEER}\"), where rank 0 serves HTTP",
                self.peers[0].ssh
            ));
        }
        for peer in &self.peers {
            if peer.ip.parse::<std::net::IpAddr>().is_err() {
                return Err(format!(
                    "{at} peer '{}' has ip = \"{}\", which is not an IP address; the ranks connect by IP (write the address, not a host name)",
                    peer.ssh, peer.ip
                ));
            }
        }
        let last = u32::from(self.port) + self.peers.len() as u32 - 1;
        if self.port == 0 || last > u32::from(u16::MAX) {
            return Err(format!(
                "{at} port = {} leaves no room for {} ranks (ports port..port+{}); pick one between 1024 and {}",
                self.port,
                self.peers.len(),
                self.peers.len() - 1,
                u16::MAX as usize - self.peers.len() + 1
            ));
        }
        Ok(())
    }
}

/// The `ssh` value that means this machine (as `mlx.launch` reads it: it
/// starts such a rank without ssh).
pub const LOCAL_PEER: &str = "127.0.0.1";

/// The runtime's settings: `[wasm]` in `config.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WasmConfig {
    /// Wall-clock time one call may take, in milliseconds.
    pub call_timeout_ms: u64,
    /// The most linear memory one instance may grow to, in MiB.
    pub memory_mib: u64,
    /// Where compiled components are cached (default: the user's cache dir,
    /// `hangar/wasm`).
    pub cache_dir: Option<PathBuf>,
}

impl Default for WasmConfig {
    fn default() -> Self {
        WasmConfig {
            call_timeout_ms: 2_000,
            memory_mib: 64,
            cache_dir: None,
        }
    }
}

/// `[images]` in `config.toml`: which images a request may name by URL
/// instead of sending their bytes (a `data:` URL, always taken). The host
/// reads or fetches such an image itself and hands every engine the bytes,
/// so engines never touch the client's URLs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ImagesConfig {
    /// Folders whose files (and their subfolders') requests may name as
    /// `file:///...` URLs. None by default: a client must not read the
    /// host's files.
    pub local_dirs: Vec<PathBuf>,
    /// Whether the host fetches `http://` and `https://` image URLs for
    /// clients. Off by default: it lets clients make the host send requests.
    pub remote: bool,
    /// With `remote`: the host names fetched from, redirects included
    /// (`images.example.com`; empty: any).
    pub remote_hosts: Vec<String>,
    /// The largest image read or fetched, in MiB.
    pub max_mib: u64,
    /// A fetch's deadline in milliseconds, from connecting to the last byte.
    pub fetch_timeout_ms: u64,
}

impl Default for ImagesConfig {
    fn default() -> Self {
        ImagesConfig {
            local_dirs: Vec::new(),
            remote: false,
            remote_hosts: Vec::new(),
            max_mib: 20,
            fetch_timeout_ms: 10_000,
        }
    }
}

impl ImagesConfig {
    /// What is wrong with `[images]`, if anything.
    fn check(&self) -> Result<(), String> {
        if self.max_mib == 0 || self.max_mib > 1024 {
            return Err(format!(
                "[images] max_mib = {} is out of range; give the largest image taken in MiB, 1 to 1024 (default 20)",
                self.max_mib
            ));
        }
        if self.fetch_timeout_ms == 0 {
            return Err(
                "[images] fetch_timeout_ms = 0 would fail every fetch; give a deadline in milliseconds (default 10000)"
                    .into(),
            );
        }
        if !self.remote_hosts.is_empty() && !self.remote {
            return Err(
                "[images] remote_hosts is set but remote is off, so nothing is fetched; add remote = true, or remove remote_hosts"
                    .into(),
            );
        }
        if let Some(bad) = self
            .remote_hosts
            .iter()
            .find(|h| h.is_empty() || h.contains(['/', ':', ' ']))
        {
            return Err(format!(
                "[images] remote_hosts has \"{bad}\", which is not a host name; list names such as \"images.example.com\" (no scheme, port or path)"
            ));
        }
        Ok(())
    }
}

/// Why the configuration could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file exists but could not be read.
    #[error("cannot read config {path}: {cause}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        cause: std::io::Error,
    },
    /// The file is not a valid config.
    #[error("config {path} is invalid: {message}; fix the file or move it aside")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

impl Config {
    /// Reads the config from `path`, or from `HANGAR_CONFIG`, or from the
    /// default location. A default location that does not exist is an empty
    /// config; an explicitly named file must exist.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let explicit = path
            .map(Path::to_path_buf)
            .or_else(|| std::env::var_os(CONFIG_ENV).map(PathBuf::from));
        let Some(path) = explicit.clone().or_else(default_path) else {
            return Ok(Config::default());
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                Config::parse(&text).map_err(|message| ConfigError::Invalid { path, message })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && explicit.is_none() => {
                Ok(Config::default())
            }
            Err(cause) => Err(ConfigError::Read { path, cause }),
        }
    }

    /// Parses config text.
    pub fn parse(text: &str) -> Result<Config, String> {
        let config: Config = toml::from_str(text).map_err(|e| e.message().to_string())?;
        for (name, cluster) in &config.clusters {
            cluster.check(name)?;
        }
        config.images.check()?;
        for (id, settings) in &config.plugins {
            let allow = settings.get(ALLOW_PROGRAMS);
            let list = allow.map(|v| v.as_array().filter(|l| l.iter().all(|p| p.is_string())));
            if let Some(None) = list {
                return Err(format!(
                    "[plugins.{id}] {ALLOW_PROGRAMS} must be a list of program names, e.g. {ALLOW_PROGRAMS} = [\"python3\"] (found {})",
                    allow.expect("present")
                ));
            }
        }
        Ok(config)
    }

    /// The settings the operator gave plugin `id`.
    pub fn plugin_settings(&self, id: &str) -> BTreeMap<String, serde_json::Value> {
        self.plugins.get(id).cloned().unwrap_or_default()
    }
}

/// The environment variable naming the settings file.
pub const SETTINGS_ENV: &str = "HANGAR_SETTINGS";

/// Where settings persist: `HANGAR_SETTINGS`, else `settings.toml` beside
/// the config file in use.
pub fn settings_path(config: Option<&Path>) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(SETTINGS_ENV) {
        return Some(PathBuf::from(path));
    }
    let config = config
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os(CONFIG_ENV).map(PathBuf::from))
        .or_else(default_path)?;
    Some(config.with_file_name("settings.toml"))
}

/// `~/.config/hangar/config.toml` (or the platform's equivalent).
pub fn default_path() -> Option<PathBuf> {
    dirs::config_dir().map(|d| d.join("hangar").join("config.toml"))
}

/// `~/.local/share/hangar/plugins` (or the platform's equivalent).
pub fn default_plugins_dir() -> Option<PathBuf> {
    dirs::data_dir().map(|d| d.join("hangar").join("plugins"))
}

/// Expands a leading `~/` to the home folder.
pub fn expand_home(path: &str) -> PathBuf {
    match (path.strip_prefix("~/"), dirs::home_dir()) {
        (Some(rest), Some(home)) => home.join(rest),
        _ => PathBuf::from(path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_programs_must_be_a_list_of_names() {
        let parsed = |text: &str| match Config::parse(text) {
            Ok(config) => format!("{:?}", config.plugins),
            Err(e) => format!("error: {e}"),
        };
        expect_test::expect![[r#"
            {"mlx-lm": {"allow_programs": Array [String("python3")]}}
            error: [plugins.mlx-lm] allow_programs must be a list of program names, e.g. allow_programs = ["python3"] (found "python3")
            error: [plugins.mlx-lm] allow_programs must be a list of program names, e.g. allow_programs = ["python3"] (found [1])"#]].assert_eq(&[
            parsed("[plugins.mlx-lm]\nallow_programs = [\"python3\"]"),
            parsed("[plugins.mlx-lm]\nallow_programs = \"python3\""),
            parsed("[plugins.mlx-lm]\nallow_programs = [1]"),
        ]
        .join("\n"));
    }

    #[test]
    fn images_settings_are_checked() {
        let parsed = |text: &str| match Config::parse(text) {
            Ok(config) => format!("{:?}", config.images),
            Err(e) => format!("error: {e}"),
        };
        expect_test::expect![[r#"
            ImagesConfig { local_dirs: [], remote: false, remote_hosts: [], max_mib: 20, fetch_timeout_ms: 10000 }
            ImagesConfig { local_dirs: ["/srv/pictures"], remote: true, remote_hosts: ["images.example.com"], max_mib: 5, fetch_timeout_ms: 10000 }
            error: [images] max_mib = 0 is out of range; give the largest image taken in MiB, 1 to 1024 (default 20)
            error: [images] fetch_timeout_ms = 0 would fail every fetch; give a deadline in milliseconds (default 10000)
            error: [images] remote_hosts is set but remote is off, so nothing is fetched; add remote = true, or remove remote_hosts
            error: [images] remote_hosts has "https://x.org", which is not a host name; list names such as "images.example.com" (no scheme, port or path)
            error: unknown field `remote_host`, expected one of `local_dirs`, `remote`, `remote_hosts`, `max_mib`, `fetch_timeout_ms`"#]]
        .assert_eq(
            &[
                parsed(""),
                parsed("[images]\nlocal_dirs = [\"/srv/pictures\"]\nremote = true\nremote_hosts = [\"images.example.com\"]\nmax_mib = 5"),
                parsed("[images]\nmax_mib = 0"),
                parsed("[images]\nfetch_timeout_ms = 0"),
                parsed("[images]\nremote_hosts = [\"x.org\"]"),
                parsed("[images]\nremote = true\nremote_hosts = [\"https://x.org\"]"),
                parsed("[images]\nremote_host = [\"x.org\"]"),
            ]
            .join("\n"),
        );
    }

    fn check(text: &str, expect: expect_test::Expect) {
        let out = match Config::parse(text) {
            Ok(config) => config
                .clusters
                .iter()
                .map(|(name, c)| {
                    let wire = c.to_wire(name, hangar_plugin_api::wire::DistributedMode::Tensor);
                    let peers: Vec<String> = wire
                        .peers
                        .iter()
                        .map(|p| {
                            format!(
                                "{}={}@{}{}",
                                p.name,
                                p.ssh,
                                p.ip,
                                if p.local { " (local)" } else { "" }
                            )
                        })
                        .collect();
                    format!("{name}: port {} peers {}", wire.port, peers.join(", "))
                })
                .collect::<Vec<_>>()
                .join("\n"),
            Err(e) => format!("error: {e}"),
        };
        expect.assert_eq(&out);
    }

    #[test]
    fn clusters_name_their_peers_in_rank_order() {
        check(
            r#"[clusters.pair]
peers = [{ ssh = "127.0.0.1", ip = "127.0.0.1" }, { name = "b", ssh = "me@b", ip = "10.0.0.2" }]"#,
            expect_test::expect![
                "pair: port 32323 peers 127.0.0.1=127.0.0.1@127.0.0.1 (local), b=me@b@10.0.0.2"
            ],
        );
        check(
            r#"[clusters.one]
peers = [{ ssh = "127.0.0.1", ip = "127.0.0.1" }]"#,
            expect_test::expect![[
                r#"error: [clusters.one] has 1 peer(s); a cluster needs at least two (this machine first, ssh = "127.0.0.1")"#
            ]],
        );
        check(
            r#"[clusters.far]
peers = [{ ssh = "me@b", ip = "10.0.0.2" }, { ssh = "127.0.0.1", ip = "127.0.0.1" }]"#,
            expect_test::expect![[
                r#"error: [clusters.far]'s first peer is 'me@b'; it must be this machine (ssh = "127.0.0.1"), where rank 0 serves HTTP"#
            ]],
        );
        check(
            r#"[clusters.named]
peers = [{ ssh = "127.0.0.1", ip = "127.0.0.1" }, { ssh = "me@b", ip = "b.local" }]"#,
            expect_test::expect![[
                r#"error: [clusters.named] peer 'me@b' has ip = "b.local", which is not an IP address; the ranks connect by IP (write the address, not a host name)"#
            ]],
        );
        check(
            r#"[clusters.high]
port = 65535
peers = [{ ssh = "127.0.0.1", ip = "127.0.0.1" }, { ssh = "me@b", ip = "10.0.0.2" }]"#,
            expect_test::expect!["error: [clusters.high] port = 65535 leaves no room for 2 ranks (ports port..port+1); pick one between 1024 and 65534"],
        );
        check(
            r#"[clusters.typo]
peers = [{ ssh = "127.0.0.1", ip = "127.0.0.1", user = "x" }, { ssh = "me@b", ip = "10.0.0.2" }]"#,
            expect_test::expect![
                "error: unknown field `user`, expected one of `name`, `ssh`, `ip`"
            ],
        );
    }
}
