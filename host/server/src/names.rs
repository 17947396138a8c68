//! Other names for a model: aliases and profiles, kept with the model's
//! own settings (`[models.<id>]` in `settings.toml`, or
//! `PUT /api/models/{id}/settings`).
//!
//! ```toml
//! [models.qwen2.5-7b-instruct-4bit]
//! aliases = ["qwen", "default"]          # requests may name the model so
//! [models.qwen2.5-7b-instruct-4bit.profiles.precise]
//! temperature = 0.1                      # `qwen2.5-7b-instruct-4bit:precise`
//! max_tokens = 2048                      # (or `qwen:precise`)
//! ```
//!
//! An alias is listed by `/v1/models` and served as the model itself; a
//! model's own id always wins over another model's alias. A profile is a
//! named bundle of per-request settings ([`PROFILE_FIELDS`]): a request to
//! `MODEL:PROFILE` runs on the model's session (no second load) with the
//! profile's values filled in where the request leaves them out. A profile
//! cannot change how the engine loads: one that names a load-time setting
//! with a value other than the model's is refused when stored, naming it.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::settings::{SettingMap, Stored};
use hangar_engine::models::{Discovery, Model};

pub(crate) use crate::settings::{ALIASES, PROFILES};

/// The request fields a profile may set: OpenAI's sampling and length
/// fields, filled into each request that lacks them.
pub(crate) const PROFILE_FIELDS: &[&str] = &[
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "stop",
    "reasoning_effort",
];

/// The longest alias, in bytes.
const MAX_ALIAS: usize = 256;
/// The longest profile name, in bytes.
const MAX_PROFILE_NAME: usize = 64;

/// What a client's model name stands for.
#[derive(Debug, Clone)]
pub(crate) struct Named {
    /// The model.
    pub model: Model,
    /// The profile the name chose, if any: its name and settings.
    pub profile: Option<(String, SettingMap)>,
}

/// Why a name does not stand for a model the host can serve with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Unnamed {
    /// Nothing of that name.
    Unknown,
    /// `MODEL:PROFILE` where the model is known and the profile is not.
    NoProfile {
        /// The model's id.
        model: String,
        /// The profile asked for.
        profile: String,
        /// The model's profiles.
        known: Vec<String>,
    },
}

/// The model (and profile) `name` stands for: a model id, an alias, or
/// either followed by `:PROFILE`.
pub(crate) fn resolve(
    discovery: &Discovery,
    stored: &Stored,
    name: &str,
) -> Result<Named, Unnamed> {
    if let Some(model) = base(discovery, stored, name) {
        return Ok(Named {
            model: model.clone(),
            profile: None,
        });
    }
    let Some((model_name, profile)) = name.rsplit_once(':') else {
        return Err(Unnamed::Unknown);
    };
    let model = base(discovery, stored, model_name).ok_or(Unnamed::Unknown)?;
    let profiles = profiles_of(stored, &model.id);
    match profiles.get(profile) {
        Some(settings) => Ok(Named {
            model: model.clone(),
            profile: Some((profile.to_string(), settings.clone())),
        }),
        None => Err(Unnamed::NoProfile {
            model: model.id.clone(),
            profile: profile.to_string(),
            known: profiles.into_keys().collect(),
        }),
    }
}

/// The model called `name` by its id or by one of its aliases.
fn base<'a>(discovery: &'a Discovery, stored: &Stored, name: &str) -> Option<&'a Model> {
    discovery.find(name).or_else(|| {
        stored
            .models
            .iter()
            .find(|(_, map)| aliases_in(map).any(|a| a == name))
            .and_then(|(id, _)| discovery.find(id))
    })
}

fn aliases_in(map: &SettingMap) -> impl Iterator<Item = &str> {
    map.get(ALIASES)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

/// The aliases stored for `model`.
pub(crate) fn aliases_of(stored: &Stored, model: &str) -> Vec<String> {
    stored
        .models
        .get(model)
        .map(|m| aliases_in(m).map(String::from).collect())
        .unwrap_or_default()
}

/// The names `model` answers to besides its id, as `/v1/models` lists
/// them: its aliases that are not another model's id (the id wins), and
/// `ID:PROFILE` for each of its profiles.
pub(crate) fn listed_names(discovery: &Discovery, stored: &Stored, model: &str) -> Listed {
    Listed {
        aliases: aliases_of(stored, model)
            .into_iter()
            .filter(|a| base(discovery, stored, a).is_some_and(|m| m.id == model))
            .collect(),
        profiles: profiles_of(stored, model)
            .into_keys()
            .map(|p| format!("{model}:{p}"))
            .collect(),
    }
}

/// What [`listed_names`] gives.
#[derive(Debug, Clone, Default)]
pub(crate) struct Listed {
    /// The aliases in effect.
    pub aliases: Vec<String>,
    /// `ID:PROFILE` for each profile.
    pub profiles: Vec<String>,
}

/// The profiles stored for `model`, by name (entries that are not tables
/// of settings are left out: the file may have been edited by hand).
pub(crate) fn profiles_of(stored: &Stored, model: &str) -> BTreeMap<String, SettingMap> {
    let Some(Value::Object(profiles)) = stored.models.get(model).and_then(|m| m.get(PROFILES))
    else {
        return BTreeMap::new();
    };
    profiles
        .iter()
        .filter_map(|(name, settings)| {
            let settings = settings.as_object()?;
            Some((
                name.clone(),
                settings
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            ))
        })
        .collect()
}

/// Fills the profile's per-request settings into `request` where it has
/// none (`max_tokens` also counts as set by `max_completion_tokens`);
/// `chat` says whether the request is a chat (only chats take
/// `reasoning_effort`).
pub(crate) fn overlay(request: &mut Map<String, Value>, profile: &SettingMap, chat: bool) {
    for (name, value) in profile {
        if !PROFILE_FIELDS.contains(&name.as_str()) || (name == "reasoning_effort" && !chat) {
            continue;
        }
        let unset = |field: &str| request.get(field).is_none_or(Value::is_null);
        if unset(name) && (name != "max_tokens" || unset("max_completion_tokens")) {
            request.insert(name.clone(), value.clone());
        }
    }
}

/// Checks the aliases and profiles of the settings `map` about to be stored
/// for model `id`: well formed, no alias another model's id or alias, and
/// no profile setting the engine cannot take per request. `check_load`
/// judges a profile's load-time setting: `Err` with why when it is not the
/// model's own value. Returns every problem.
pub(crate) fn check(
    discovery: &Discovery,
    stored: &Stored,
    id: &str,
    map: &SettingMap,
    check_request: impl Fn(&Map<String, Value>) -> Result<(), String>,
    check_load: impl Fn(&str, &Value) -> Result<(), String>,
) -> Vec<String> {
    let mut problems = Vec::new();
    match map.get(ALIASES) {
        None => {}
        Some(Value::Array(aliases)) => {
            for (i, alias) in aliases.iter().enumerate() {
                let at = format!("{ALIASES}[{i}]");
                let Some(alias) = alias.as_str() else {
                    problems.push(format!("{at} must be a string, not {alias}"));
                    continue;
                };
                if let Err(why) = check_alias(discovery, stored, id, alias) {
                    problems.push(format!("{at} ('{alias}') {why}"));
                } else if aliases[..i].iter().any(|a| a.as_str() == Some(alias)) {
                    problems.push(format!("{at} ('{alias}') is listed twice"));
                }
            }
        }
        Some(other) => problems.push(format!(
            "'{ALIASES}' must be a list of names, like [\"qwen\"], not {other}"
        )),
    }
    match map.get(PROFILES) {
        None => {}
        Some(Value::Object(profiles)) => {
            for (name, settings) in profiles {
                let at = format!("{PROFILES}.{name}");
                if let Err(why) = check_profile_name(name) {
                    problems.push(format!("{at}: {why}"));
                }
                let Some(settings) = settings.as_object() else {
                    problems.push(format!(
                        "{at} must be a table of settings, like {{\"temperature\": 0.2}}, not {settings}"
                    ));
                    continue;
                };
                problems.extend(
                    check_profile(settings, &check_request, &check_load)
                        .into_iter()
                        .map(|p| format!("{at}: {p}")),
                );
            }
        }
        Some(other) => problems.push(format!(
            "'{PROFILES}' must be a table of named tables of settings, like {{\"precise\": {{\"temperature\": 0.1}}}}, not {other}"
        )),
    }
    problems
}

fn check_alias(
    discovery: &Discovery,
    stored: &Stored,
    id: &str,
    alias: &str,
) -> Result<(), String> {
    if alias.is_empty() || alias.len() > MAX_ALIAS {
        return Err(format!("must be 1 to {MAX_ALIAS} bytes long"));
    }
    if alias.contains(':') {
        return Err("has a ':', which names a profile (MODEL:PROFILE); aliases cannot".into());
    }
    if alias.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("has whitespace or a control character".into());
    }
    if alias == id {
        return Err("is the model's own id".into());
    }
    if discovery.find(alias).is_some() {
        return Err("is already a model's id".into());
    }
    match stored
        .models
        .iter()
        .find(|(other, map)| other.as_str() != id && aliases_in(map).any(|a| a == alias))
    {
        Some((other, _)) => Err(format!("is already an alias of model '{other}'")),
        None => Ok(()),
    }
}

fn check_profile_name(name: &str) -> Result<(), String> {
    let well_formed = !name.is_empty()
        && name.len() <= MAX_PROFILE_NAME
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    match well_formed {
        true => Ok(()),
        false => Err(format!(
            "a profile's name is 1 to {MAX_PROFILE_NAME} letters, digits, '.', '_' or '-', starting with a letter or digit"
        )),
    }
}

fn check_profile(
    settings: &Map<String, Value>,
    check_request: &impl Fn(&Map<String, Value>) -> Result<(), String>,
    check_load: &impl Fn(&str, &Value) -> Result<(), String>,
) -> Vec<String> {
    let (request, load): (Map<String, Value>, Map<String, Value>) = settings
        .clone()
        .into_iter()
        .partition(|(name, _)| PROFILE_FIELDS.contains(&name.as_str()));
    let mut problems: Vec<String> = check_request(&request).err().into_iter().collect();
    problems.extend(
        load.iter()
            .filter_map(|(name, value)| check_load(name, value).err()),
    );
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn discovery(ids: &[&str]) -> Discovery {
        Discovery {
            models: ids
                .iter()
                .map(|id| Model {
                    id: id.to_string(),
                    path: format!("/m/{id}").into(),
                    format: "mlx".into(),
                    source: hangar_engine::models::ModelSource::Folder,
                    size_bytes: 0,
                    files: vec![],
                    rule: String::new(),
                    kind: hangar_engine::models::ModelKind::Chat,
                    model_type: None,
                    vision: false,
                })
                .collect(),
            rejected: vec![],
        }
    }

    fn stored(toml: &str) -> Stored {
        toml::from_str(toml).unwrap()
    }

    const STORED: &str = r#"
[models.tiny]
aliases = ["small", "t"]
[models.tiny.profiles.precise]
temperature = 0.1
max_tokens = 8
[models.other]
aliases = ["o"]
"#;

    #[test]
    fn names_resolve_to_the_model_and_profile() {
        let d = discovery(&["other", "tiny"]);
        let s = stored(STORED);
        let named = |n| resolve(&d, &s, n).map(|n| (n.model.id, n.profile.map(|p| p.0)));
        assert_eq!(named("tiny"), Ok(("tiny".into(), None)));
        assert_eq!(named("small"), Ok(("tiny".into(), None)));
        assert_eq!(
            named("t:precise"),
            Ok(("tiny".into(), Some("precise".into())))
        );
        assert_eq!(
            named("tiny:precise"),
            Ok(("tiny".into(), Some("precise".into())))
        );
        assert_eq!(
            named("tiny:loose"),
            Err(Unnamed::NoProfile {
                model: "tiny".into(),
                profile: "loose".into(),
                known: vec!["precise".into()]
            })
        );
        assert_eq!(named("nope"), Err(Unnamed::Unknown));
        assert_eq!(named("nope:precise"), Err(Unnamed::Unknown));
        // A model's own id wins over an alias of the same name.
        let d = discovery(&["other", "small", "tiny"]);
        assert_eq!(
            resolve(&d, &s, "small").unwrap().model.id,
            "small".to_string()
        );
    }

    #[test]
    fn a_profile_fills_only_what_the_request_leaves_out() {
        let profile: SettingMap = [
            ("temperature".to_string(), json!(0.1)),
            ("max_tokens".to_string(), json!(8)),
            ("reasoning_effort".to_string(), json!("low")),
            ("kv_cache_type".to_string(), json!("int8")),
        ]
        .into();
        let mut request = json!({"temperature": 0.9, "max_completion_tokens": 3, "top_p": null})
            .as_object()
            .unwrap()
            .clone();
        overlay(&mut request, &profile, false);
        assert_eq!(
            Value::Object(request),
            json!({"temperature": 0.9, "max_completion_tokens": 3, "top_p": null})
        );
        let mut request = Map::new();
        overlay(&mut request, &profile, true);
        assert_eq!(
            Value::Object(request),
            json!({"temperature": 0.1, "max_tokens": 8, "reasoning_effort": "low"})
        );
    }

    #[test]
    fn bad_aliases_and_profiles_are_named() {
        let d = discovery(&["other", "tiny"]);
        let s = stored(STORED);
        let map: SettingMap = json!({
            "aliases": ["o", "tiny", "other", "a:b", "", "ok", "ok", 5],
            "profiles": {"-bad": {}, "fine": {"temperature": 9, "kv_cache_type": "int8"}, "x": 1},
        })
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
        let problems = check(
            &d,
            &s,
            "tiny",
            &map,
            |r| match r.get("temperature").and_then(Value::as_f64) {
                Some(t) if t > 2.0 => Err(format!("'temperature' is {t}, above 2")),
                _ => Ok(()),
            },
            |name, _| Err(format!("'{name}' is a load-time setting")),
        );
        expect_test::expect![[r#"
            aliases[0] ('o') is already an alias of model 'other'
            aliases[1] ('tiny') is the model's own id
            aliases[2] ('other') is already a model's id
            aliases[3] ('a:b') has a ':', which names a profile (MODEL:PROFILE); aliases cannot
            aliases[4] ('') must be 1 to 256 bytes long
            aliases[6] ('ok') is listed twice
            aliases[7] must be a string, not 5
            profiles.-bad: a profile's name is 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit
            profiles.fine: 'temperature' is 9, above 2
            profiles.fine: 'kv_cache_type' is a load-time setting
            profiles.x must be a table of settings, like {"temperature": 0.2}, not 1"#]]
        .assert_eq(&problems.join("\n"));
    }
}
