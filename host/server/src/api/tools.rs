//! Tools, tool choice and structured output in a chat request.
//!
//! Checked at the edge like every other field: a malformed `tools`,
//! `tool_choice`, `parallel_tool_calls`, `response_format` or tool message
//! is a 400 naming the field. Then what the serving engine and the model's
//! chat template cannot honour is refused with a 400 naming the capability
//! and the engine, never answered as if the constraint were not there:
//! `tools` needs the engine's `tool_calls` capability and a template that
//! renders them; a forced tool choice (`required`, a named function) and
//! `response_format` `json_object`/`json_schema` need `structured_output`
//! (a grammar engine). `tool_choice: "none"` is honoured by not showing
//! the model the tools at all.
//!
//! What passes becomes a [`Plan`] for the answer: which markup to parse
//! tool calls in (the operator's `tool_parser` model setting, else what the
//! model's chat template teaches, else the plugin's declaration) and
//! whether the template marks reasoning.

use serde_json::{Map, Value};

use super::inprocess::GRAMMAR_FIELD;
use super::split::Plan;
use super::{ApiError, App};
use crate::settings::names_residency::TOOL_PARSER;
use crate::toolcall::{lark, Forced, Format};
use hangar_engine::models::Model;
use hangar_engine::registry::{Engine, EngineState, PluginEntry};
use hangar_plugin_api::capability::{STRUCTURED_OUTPUT, TOOL_CALLS};

/// Which tool the model may or must call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Choice {
    /// The model decides (the default with tools).
    Auto,
    /// No tool.
    None,
    /// Some tool.
    Required,
    /// This function.
    Named(String),
}

/// A request's tool fields, checked.
#[derive(Debug, Clone)]
pub(crate) struct Ask {
    /// OpenAI's `tools`.
    pub tools: Vec<Value>,
    /// `tool_choice`.
    pub choice: Choice,
    /// `parallel_tool_calls` (default true).
    pub parallel: bool,
    /// `response_format`'s type, when it asks for JSON.
    pub json: Option<String>,
    /// The schema of that JSON (`{"type": "object"}` for `json_object`).
    pub schema: Option<Value>,
}

impl Ask {
    /// Whether the model is shown tools and may call them.
    pub(crate) fn uses_tools(&self) -> bool {
        !self.tools.is_empty() && self.choice != Choice::None
    }

    /// What the answer is forced to be, if anything: a call (`required`,
    /// a named function), or JSON (`response_format`), or JSON or a call
    /// (JSON with tools the model may call).
    pub(crate) fn forced(&self) -> Option<Forced> {
        let tools: Vec<Value> = match &self.choice {
            Choice::None => Vec::new(),
            Choice::Auto if self.schema.is_none() => return None,
            Choice::Auto | Choice::Required => self.tools.clone(),
            Choice::Named(name) => self
                .tools
                .iter()
                .filter(|t| t.pointer("/function/name").and_then(Value::as_str) == Some(name))
                .cloned()
                .collect(),
        };
        let json = match self.choice {
            Choice::Auto | Choice::None => self.schema.clone(),
            Choice::Required | Choice::Named(_) => None,
        };
        (json.is_some() || !tools.is_empty()).then_some(Forced {
            json,
            tools,
            parallel: self.parallel,
        })
    }
}

/// Reads and checks the tool fields of a chat request, and the tool parts
/// of its messages.
pub(crate) fn read(request: &Map<String, Value>) -> Result<Ask, ApiError> {
    let bad = |field: &'static str, what: String| Err(ApiError::bad_request(what, Some(field)));
    let tools = match request.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(tools)) => tools.clone(),
        Some(other) => return bad("tools", format!("'tools' must be a list of {{\"type\": \"function\", \"function\": {{\"name\", \"parameters\"}}}} objects, not {other}")),
    };
    let mut names = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        match tool.get("type") {
            Some(Value::String(t)) if t == "function" => {}
            None => {
                return bad(
                    "tools",
                    format!("'tools[{i}].type' is missing; it must be \"function\""),
                )
            }
            Some(other) => {
                return bad(
                    "tools",
                    format!(
                    "'tools[{i}].type' must be \"function\" (the only kind of tool), not {other}"
                ),
                )
            }
        }
        let Some(Value::Object(function)) = tool.get("function") else {
            return bad(
                "tools",
                format!(
                    "'tools[{i}].function' must be an object with 'name' and 'parameters', not {}",
                    tool.get("function").unwrap_or(&Value::Null)
                ),
            );
        };
        let name = match function.get("name") {
            Some(Value::String(n)) if is_function_name(n) => n,
            Some(other) => return bad("tools", format!("'tools[{i}].function.name' must be 1 to 64 letters, digits, '_' or '-', not {other}")),
            None => return bad("tools", format!("'tools[{i}].function.name' is missing")),
        };
        if names.contains(&name.as_str()) {
            return bad(
                "tools",
                format!(
                    "'tools[{i}].function.name' repeats '{name}'; each tool needs its own name"
                ),
            );
        }
        names.push(name.as_str());
        match function.get("description") {
            None | Some(Value::Null) | Some(Value::String(_)) => {}
            Some(other) => {
                return bad(
                    "tools",
                    format!("'tools[{i}].function.description' must be a string, not {other}"),
                )
            }
        }
        match function.get("parameters") {
            None | Some(Value::Null) | Some(Value::Object(_)) => {}
            Some(other) => {
                return bad(
                    "tools",
                    format!(
                    "'tools[{i}].function.parameters' must be a JSON Schema object, not {other}"
                ),
                )
            }
        }
        match function.get("strict") {
            None | Some(Value::Null) | Some(Value::Bool(_)) => {}
            Some(other) => {
                return bad(
                    "tools",
                    format!("'tools[{i}].function.strict' must be true or false, not {other}"),
                )
            }
        }
    }
    let choice = match request.get("tool_choice") {
        None | Some(Value::Null) => Choice::Auto,
        Some(Value::String(c)) if c == "auto" => Choice::Auto,
        Some(Value::String(c)) if c == "none" => Choice::None,
        Some(Value::String(c)) if c == "required" => Choice::Required,
        Some(Value::Object(c)) => {
            let name = c
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str);
            match (c.get("type").and_then(Value::as_str), name) {
                (Some("function"), Some(name)) => Choice::Named(name.to_string()),
                _ => return bad("tool_choice", format!("'tool_choice' as an object must be {{\"type\": \"function\", \"function\": {{\"name\": \"...\"}}}}, not {}", Value::Object(c.clone()))),
            }
        }
        Some(other) => return bad("tool_choice", format!("'tool_choice' must be \"auto\", \"none\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": \"...\"}}}}, not {other}")),
    };
    match &choice {
        Choice::Required if tools.is_empty() => {
            return bad(
                "tool_choice",
                "'tool_choice' is \"required\" but the request has no 'tools'".into(),
            )
        }
        Choice::Named(name) if !names.contains(&name.as_str()) => {
            return bad(
                "tool_choice",
                format!(
                    "'tool_choice' names function '{name}', which is not in 'tools' ({})",
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                ),
            )
        }
        _ => {}
    }
    let parallel = match request.get("parallel_tool_calls") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return bad(
                "parallel_tool_calls",
                format!("'parallel_tool_calls' must be true or false, not {other}"),
            )
        }
    };
    let schema = match request.get("response_format") {
        Some(Value::Object(format)) => match format.get("type").and_then(Value::as_str) {
            Some("json_object") => Some(serde_json::json!({"type": "object"})),
            // No schema: any JSON.
            Some("json_schema") => Some(
                match format.get("json_schema").and_then(|j| j.get("schema")) {
                    Some(schema @ Value::Object(_)) => schema.clone(),
                    _ => serde_json::json!({}),
                },
            ),
            _ => None,
        },
        _ => None,
    };
    let json = match request.get("response_format") {
        None | Some(Value::Null) => None,
        Some(Value::Object(format)) => {
            json_schema_format(format.get("json_schema"))?;
            match format.get("type").and_then(Value::as_str) {
                Some("text") => None,
                Some("json_object") => Some("json_object".to_string()),
                Some("json_schema") if format.get("json_schema").is_some_and(Value::is_object) => {
                    Some("json_schema".to_string())
                }
                Some("json_schema") => return bad("response_format", "'response_format.json_schema' is required with type \"json_schema\": {\"name\", \"schema\", \"strict\"}".into()),
                _ => return bad("response_format", format!("'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", not {}", format.get("type").unwrap_or(&Value::Null))),
            }
        }
        Some(other) => return bad("response_format", format!("'response_format' must be an object such as {{\"type\": \"json_object\"}}, not {other}")),
    };
    Ok(Ask {
        tools,
        choice,
        parallel,
        json,
        schema,
    })
}

/// `response_format.json_schema`, when present: `{"name", "schema", "strict"}`.
fn json_schema_format(value: Option<&Value>) -> Result<(), ApiError> {
    let bad = |what: &str| Err(ApiError::bad_request(what, Some("response_format")));
    let format = match value {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Object(format)) => format,
        Some(_) => return bad(
            "'response_format.json_schema' must be an object with a string 'name' and a 'schema'",
        ),
    };
    if !format.get("name").is_some_and(Value::is_string) {
        return bad("'response_format.json_schema.name' must be a string");
    }
    if !format
        .get("schema")
        .is_none_or(|s| s.is_object() || s.is_null())
    {
        return bad("'response_format.json_schema.schema' must be a JSON Schema object");
    }
    if !format
        .get("strict")
        .is_none_or(|s| s.is_boolean() || s.is_null())
    {
        return bad("'response_format.json_schema.strict' must be true or false");
    }
    Ok(())
}

/// Whether `name` is a function name OpenAI accepts.
fn is_function_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Whether a call's `arguments` text is JSON (or empty: no arguments).
pub(crate) fn json_arguments(text: &str) -> Result<(), serde_json::Error> {
    if text.is_empty() {
        return Ok(());
    }
    serde_json::from_str::<serde::de::IgnoredAny>(text).map(|_| ())
}

/// Checks the tool parts of one chat message: an assistant's `tool_calls`
/// and a `tool` message's `tool_call_id`.
pub(crate) fn check_message(i: usize, message: &Map<String, Value>) -> Result<(), ApiError> {
    let bad = |what: String| Err(ApiError::bad_request(what, Some("messages")));
    match message.get("tool_calls") {
        None | Some(Value::Null) => {}
        Some(Value::Array(calls)) => {
            for (j, call) in calls.iter().enumerate() {
                let function = call.get("function");
                let name = function.and_then(|f| f.get("name"));
                let arguments = function.and_then(|f| f.get("arguments"));
                if !call
                    .get("type")
                    .is_none_or(|t| t.is_string() || t.is_null())
                {
                    return bad(format!(
                        "'messages[{i}].tool_calls[{j}].type' must be \"function\""
                    ));
                }
                if !call.get("id").is_some_and(Value::is_string) {
                    return bad(format!("'messages[{i}].tool_calls[{j}].id' must be a string (the id the answer gave the call)"));
                }
                if !name.is_some_and(Value::is_string) {
                    return bad(format!(
                        "'messages[{i}].tool_calls[{j}].function.name' must be a string"
                    ));
                }
                match arguments {
                    Some(Value::String(text)) => {
                        // Engines parse it to render the call (mlx_lm.server's
                        // generation failed on any other text); an empty one
                        // is a call without arguments.
                        if let Err(e) = json_arguments(text) {
                            return bad(format!("'messages[{i}].tool_calls[{j}].function.arguments' must be a string of JSON, as the answer gave it; it is not JSON ({e})"));
                        }
                    }
                    _ => return bad(format!("'messages[{i}].tool_calls[{j}].function.arguments' must be a string of JSON, as the answer gave it")),
                }
            }
        }
        Some(other) => {
            return bad(format!(
                "'messages[{i}].tool_calls' must be a list of calls, not {other}"
            ))
        }
    }
    let id = message.get("tool_call_id").filter(|v| !v.is_null());
    let is_tool = message.get("role").and_then(Value::as_str) == Some("tool");
    if id.is_some_and(|v| !v.is_string()) || (is_tool && id.is_none()) {
        return bad(format!("'messages[{i}].tool_call_id' must be a string: the id of the call this message answers"));
    }
    Ok(())
}

/// A request whose answer is forced (JSON, a call), to be enforced by the
/// engine that serves it.
#[derive(Debug, Clone)]
pub(super) struct Constraint {
    forced: Forced,
    format: Option<Format>,
    field: &'static str,
    what: String,
}

/// Refuses what the serving engine or the model cannot honour, shapes the
/// request for the engine (`tool_choice: "none"` hides the tools), and
/// returns how to read the answer (`None`: as it comes) and what the
/// answer is forced to be.
pub(super) async fn plan(
    app: &App,
    model: &Model,
    request: &mut Map<String, Value>,
) -> Result<(Option<Plan>, Option<Constraint>), ApiError> {
    let ask = read(request)?;
    let traits = app.catalog.chat(&model.id);
    let serving = app.sessions.serving(model).await;
    if let Some(kind) = &ask.json {
        need(
            serving,
            model,
            STRUCTURED_OUTPUT,
            "response_format",
            &format!("'response_format' {kind}"),
        )?;
    }
    match &ask.choice {
        Choice::Required => need(
            serving,
            model,
            STRUCTURED_OUTPUT,
            "tool_choice",
            "'tool_choice' \"required\"",
        )?,
        Choice::Named(name) => need(
            serving,
            model,
            STRUCTURED_OUTPUT,
            "tool_choice",
            &format!("'tool_choice' naming '{name}'"),
        )?,
        _ => {}
    }
    if ask.uses_tools() {
        need(serving, model, TOOL_CALLS, "tools", "'tools'")?;
        if traits.known && !traits.takes_tools {
            return Err(ApiError {
                code: "tools_unsupported",
                ..ApiError::bad_request(
                    format!("model '{}' cannot take 'tools': its chat template does not render them, so the model would never see them; use a model whose template takes tools (GET /api/models says which do)", model.id),
                    Some("tools"),
                )
            });
        }
    } else if ask.choice == Choice::None {
        // Not shown, not called: the one way to honour "none" without a grammar.
        for field in ["tools", "tool_choice", "parallel_tool_calls"] {
            request.remove(field);
        }
    }
    let format = match ask.uses_tools() {
        true => tool_format(app, model, serving.map(|(e, _)| e)),
        false => None,
    };
    let constraint = ask.forced().map(|forced| {
        let (field, what) = match (&forced.json, &ask.choice) {
            (Some(_), _) => (
                "response_format",
                format!(
                    "'response_format' {}",
                    ask.json.as_deref().unwrap_or("json")
                ),
            ),
            (None, Choice::Named(name)) => {
                ("tool_choice", format!("'tool_choice' naming '{name}'"))
            }
            (None, _) => ("tool_choice", "'tool_choice' \"required\"".to_string()),
        };
        Constraint {
            forced,
            format,
            field,
            what,
        }
    });
    let plan = Plan::new(traits, format, &ask);
    Ok((plan.is_active().then_some(plan), constraint))
}

/// Puts the grammar of `constraint` in the request for an in-process
/// engine (engines behind an endpoint read the request's own fields), or
/// refuses the request: the engine that loaded the model may not be the one
/// resolution picked (a fallback), and it must have `structured_output` too.
pub(super) fn enforce(
    app: &App,
    model: &Model,
    plugin: &str,
    constraint: &Constraint,
    request: &mut Map<String, Value>,
) -> Result<(), ApiError> {
    let registry = app.sessions.registry();
    let entry = registry.plugin(plugin);
    let serving = entry.and_then(|entry| match registry.engine(entry) {
        EngineState::Ready(engine) => Some((entry, engine)),
        _ => None,
    });
    need(
        serving,
        model,
        STRUCTURED_OUTPUT,
        constraint.field,
        &constraint.what,
    )?;
    if entry.is_some_and(|e| e.manifest.in_process) {
        let grammar = lark(&constraint.forced, constraint.format).map_err(|e| {
            ApiError::bad_request(
                format!(
                    "{} cannot be enforced for model '{}': {e}",
                    constraint.what, model.id
                ),
                Some(constraint.field),
            )
        })?;
        request.insert(GRAMMAR_FIELD.into(), Value::String(grammar));
    }
    Ok(())
}

/// The markup model `model` writes tool calls in: the operator's
/// `tool_parser` setting, else its chat template's, else its plugin's.
pub(crate) fn tool_format(app: &App, model: &Model, entry: Option<&PluginEntry>) -> Option<Format> {
    let stored = app.sessions.settings().get();
    let setting = stored
        .models
        .get(&model.id)
        .and_then(|m| m.get(TOOL_PARSER))
        .and_then(Value::as_str)
        .and_then(Format::from_name);
    setting
        .or(app.catalog.chat(&model.id).format)
        .or_else(|| {
            let declared = entry?.manifest.tool_parser.as_deref()?;
            let format = Format::from_name(declared);
            if format.is_none() {
                tracing::warn!(
                    "plugin '{}' declares tool_parser = {declared:?}, which this host does not know ({}); tool calls of its models are left as text",
                    entry?.manifest.id,
                    Format::names().join(", ")
                );
            }
            format
        })
}

/// A 400 unless the serving engine has `capability` (declared and on at
/// its version); nothing is refused while no engine is known (loading
/// reports that with the whole story).
fn need(
    serving: Option<(&PluginEntry, &Engine)>,
    model: &Model,
    capability: &str,
    field: &'static str,
    what: &str,
) -> Result<(), ApiError> {
    let Some((entry, engine)) = serving else {
        return Ok(());
    };
    let reason = match entry.manifest.capabilities.contains_key(capability) {
        false => format!("plugin '{}' does not declare it", entry.manifest.id),
        true => match crate::settings::capability_off(entry, engine, capability) {
            None => return Ok(()),
            Some(reason) => reason,
        },
    };
    Err(ApiError {
        code: "capability_unavailable",
        ..ApiError::bad_request(
            format!(
                "{what} needs capability '{capability}', which engine '{}' serving model '{}' does not have ({reason}); send the request without it, or serve the model with an engine that has it",
                entry.manifest.id, model.id
            ),
            Some(field),
        )
    })
}
