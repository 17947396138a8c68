//! Settings a plugin declares in its manifest: their names, types,
//! defaults, and the capability each needs.
//!
//! The host builds the settings schema from these declarations without
//! running plugin code, checks every value an operator stores or a request
//! sends, and refuses (HTTP 422) a setting whose capability is off for the
//! probed engine version, so that a flag never reaches a binary that does
//! not know it.
//!
//! ```toml
//! [[settings]]
//! name = "kv_cache_type"
//! type = "enum"
//! values = ["fp16", "int8", { value = "turbo4", capability = "kv_cache_turbo" }]
//! default = "fp16"
//! capability = "kv_cache_quantization"
//! description = "KV cache element type"
//! ```

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The type of a setting's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SettingType {
    /// A whole number (`min`/`max` apply).
    Integer,
    /// Any number (`min`/`max` apply).
    Number,
    /// `true` or `false`.
    Boolean,
    /// Free text.
    String,
    /// A local file-system path (a hub name is not a path).
    Path,
    /// One of `values`.
    Enum,
    /// A JSON object (passed through, e.g. chat template arguments).
    Object,
    /// A list (of strings or objects).
    List,
}

/// One allowed value of an enum setting, possibly gated on a capability of
/// its own (`turbo4` needs a newer engine than `int8`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EnumValue {
    /// Allowed whenever the setting is.
    Plain(String),
    /// Allowed only when `capability` is on.
    Gated {
        /// The value.
        value: String,
        /// The capability it needs.
        capability: String,
    },
}

impl EnumValue {
    /// The value itself.
    pub fn value(&self) -> &str {
        match self {
            EnumValue::Plain(v) | EnumValue::Gated { value: v, .. } => v,
        }
    }

    /// The capability the value needs, if any beyond the setting's.
    pub fn capability(&self) -> Option<&str> {
        match self {
            EnumValue::Plain(_) => None,
            EnumValue::Gated { capability, .. } => Some(capability),
        }
    }
}

/// A setting a plugin understands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettingSpec {
    /// The setting's name (lowercase snake_case). Names in
    /// [`crate::wire::settings`] mean the same for every plugin.
    pub name: String,
    /// The value's type.
    #[serde(rename = "type")]
    pub kind: SettingType,
    /// What it does, for the schema.
    #[serde(default)]
    pub description: String,
    /// The engine's own default, shown in the schema.
    #[serde(default)]
    pub default: Option<Value>,
    /// The capability the setting needs; `None`: always available.
    #[serde(default)]
    pub capability: Option<String>,
    /// The allowed values of an enum.
    #[serde(default)]
    pub values: Vec<EnumValue>,
    /// Smallest allowed number.
    #[serde(default)]
    pub min: Option<f64>,
    /// Largest allowed number.
    #[serde(default)]
    pub max: Option<f64>,
}

impl SettingSpec {
    /// Checks `value`'s type and range, and that any capability an enum
    /// value needs is on (`enabled` says which capabilities are). The
    /// setting's own capability is the caller's business, since the caller
    /// words that refusal with versions.
    pub fn check(&self, value: &Value, enabled: impl Fn(&str) -> bool) -> Result<(), String> {
        let name = &self.name;
        let type_error = |want: &str| Err(format!("setting '{name}' must be {want}, not {value}"));
        match self.kind {
            SettingType::Integer if !(value.is_i64() || value.is_u64()) => {
                return type_error("a whole number")
            }
            SettingType::Number if !value.is_number() => return type_error("a number"),
            SettingType::Boolean if !value.is_boolean() => return type_error("true or false"),
            SettingType::String | SettingType::Path | SettingType::Enum if !value.is_string() => {
                return type_error("a string")
            }
            SettingType::Object if !value.is_object() => return type_error("an object"),
            SettingType::List if !value.is_array() => return type_error("a list"),
            _ => {}
        }
        if let Some(n) = value.as_f64() {
            if self.min.is_some_and(|min| n < min) || self.max.is_some_and(|max| n > max) {
                let range = match (self.min, self.max) {
                    (Some(a), Some(b)) => format!("between {a} and {b}"),
                    (Some(a), None) => format!("at least {a}"),
                    (None, Some(b)) => format!("at most {b}"),
                    (None, None) => unreachable!("a bound was crossed"),
                };
                return Err(format!("setting '{name}' must be {range}, not {n}"));
            }
        }
        if self.kind == SettingType::Path {
            let path = value.as_str().unwrap_or_default();
            if !(path.starts_with('/') || path.starts_with("~/") || path.starts_with('.')) {
                return Err(format!(
                    "setting '{name}' must be a local path (absolute, ~/… or ./…), not '{path}'; hub names are not fetched, download the model into a folder first"
                ));
            }
        }
        if self.kind == SettingType::Enum {
            let v = value.as_str().unwrap_or_default();
            let allowed: Vec<&EnumValue> = self.values.iter().collect();
            match allowed.iter().find(|e| e.value() == v) {
                None => {
                    let names: Vec<&str> = allowed.iter().map(|e| e.value()).collect();
                    return Err(format!(
                        "setting '{name}' must be one of {}, not '{v}'",
                        names.join(", ")
                    ));
                }
                Some(e) => {
                    if let Some(cap) = e.capability().filter(|c| !enabled(c)) {
                        return Err(format!(
                            "value '{v}' of setting '{name}' needs capability {cap}, which is off"
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(toml_text: &str) -> SettingSpec {
        toml::from_str(toml_text).unwrap()
    }

    #[test]
    fn values_are_checked_by_type_range_and_gate() {
        let kv = spec(
            r#"name = "kv"
            type = "enum"
            values = ["fp16", "int8", { value = "turbo4", capability = "turbo" }]"#,
        );
        assert!(kv.check(&json!("int8"), |_| false).is_ok());
        assert!(kv
            .check(&json!("q2"), |_| true)
            .unwrap_err()
            .contains("one of fp16, int8, turbo4"));
        assert!(kv
            .check(&json!("turbo4"), |_| false)
            .unwrap_err()
            .contains("needs capability turbo"));
        assert!(kv.check(&json!("turbo4"), |c| c == "turbo").is_ok());
        let n = spec("name = \"n\"\ntype = \"integer\"\nmin = 1\nmax = 8");
        assert!(n
            .check(&json!(9), |_| true)
            .unwrap_err()
            .contains("between 1 and 8"));
        assert!(n
            .check(&json!(1.5), |_| true)
            .unwrap_err()
            .contains("whole number"));
        let p = spec("name = \"draft\"\ntype = \"path\"");
        assert!(p
            .check(&json!("org/model"), |_| true)
            .unwrap_err()
            .contains("hub names"));
        assert!(p.check(&json!("/models/draft"), |_| true).is_ok());
    }
}
