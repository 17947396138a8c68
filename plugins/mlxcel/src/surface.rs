//! The options an `mlxcel-server` binary accepts, read from the binary
//! itself rather than from a table of versions.
//!
//! The manifest's `[flag_surface]` has the host run
//! `mlxcel-server --dump-flag-surface` and, where that fails (builds
//! before it, which answer clap's "unexpected argument" with exit 2),
//! `mlxcel-server --help`. [`options`] reads either:
//!
//! - the dump (mlxcel's `src/cli/flag_surface.rs` @ 0c21aed20beb, schema
//!   version 1): `{"schema_version": 1, "binary": …, "args": [{"long",
//!   "long_aliases", "short", "short_aliases", …}]}`, hidden arguments
//!   included;
//! - clap's help: the option column of each line (`-c, --ctx-size
//!   <CTX_SIZE>`) and its `[aliases: …]` and `[short aliases: …]`. Help
//!   leaves out hidden arguments, so a build that has only `--help` shows
//!   its visible options alone; every option a capability needs is a
//!   visible one in the builds read.
//!
//! The host then turns each capability of `[flag_surface.capabilities]` on
//! exactly when the binary accepts its options, and `plan_launch` picks
//! the spelling a binary parses (`--no-prompt-cache` or
//! `--prompt-cache-enabled=false`) from the same set.

use hangar_sdk::wire::ProbeRun;
use serde_json::Value;

/// The dump's layout this plugin reads.
const SCHEMA_VERSION: u64 = 1;

/// The options the surface run shows the binary accepts (`--ctx-size`,
/// `-c`), or why it shows none.
pub fn options(run: &ProbeRun) -> Result<Vec<String>, String> {
    let ProbeRun::Exited {
        program,
        code,
        stdout,
        ..
    } = run
    else {
        return Err("its command-line surface could not be read (the run did not finish)".into());
    };
    if *code != Some(0) {
        return Err(format!(
            "neither `{program} --dump-flag-surface` nor `{program} --help` succeeded"
        ));
    }
    let text = stdout.trim_start();
    let options = if text.starts_with('{') {
        from_dump(text)?
    } else {
        from_help(text)
    };
    if options.is_empty() {
        return Err(format!(
            "`{program} --help` lists no options ({:?})",
            text.chars().take(80).collect::<String>()
        ));
    }
    Ok(options)
}

/// The options of a `--dump-flag-surface` document.
fn from_dump(text: &str) -> Result<Vec<String>, String> {
    let doc: Value = serde_json::from_str(text)
        .map_err(|e| format!("its --dump-flag-surface output is not JSON ({e})"))?;
    let schema = doc.get("schema_version").and_then(Value::as_u64);
    if schema != Some(SCHEMA_VERSION) {
        return Err(format!(
            "its --dump-flag-surface has schema_version {}, and this plugin reads {SCHEMA_VERSION}",
            schema.map_or("none".into(), |s| s.to_string())
        ));
    }
    let args = doc
        .get("args")
        .and_then(Value::as_array)
        .ok_or("its --dump-flag-surface has no args list")?;
    let names = |arg: &Value, one: &str, many: &str, dashes: &str| {
        let one = arg.get(one).and_then(Value::as_str).map(str::to_string);
        let many = arg
            .get(many)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string));
        one.into_iter()
            .chain(many)
            .map(|name| format!("{dashes}{name}"))
            .collect::<Vec<_>>()
    };
    Ok(args
        .iter()
        .flat_map(|arg| {
            let mut all = names(arg, "long", "long_aliases", "--");
            all.extend(names(arg, "short", "short_aliases", "-"));
            all
        })
        .collect())
}

/// The options of clap's `--help` text.
fn from_help(text: &str) -> Vec<String> {
    let mut options = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with('-') {
            // The option column ends at the first word that is not an
            // option: `<VALUE>`, `[=<BOOL>]` or the description.
            for word in trimmed.split([' ', ',']).filter(|w| !w.is_empty()) {
                let name = word.split(['=', '[']).next().unwrap_or(word);
                if !is_option(name) {
                    break;
                }
                options.push(name.to_string());
            }
        }
        for (marker, dashes) in [("[aliases: ", ""), ("[short aliases: ", "-")] {
            let Some(start) = line.find(marker) else {
                continue;
            };
            let list = &line[start + marker.len()..];
            let list = &list[..list.find(']').unwrap_or(list.len())];
            options.extend(
                list.split(',')
                    .map(str::trim)
                    .map(|name| match (dashes, name.starts_with('-')) {
                        ("", false) => format!("--{name}"),
                        (_, false) => format!("{dashes}{name}"),
                        _ => name.to_string(),
                    })
                    .filter(|name| is_option(name)),
            );
        }
    }
    options
}

fn is_option(word: &str) -> bool {
    hangar_sdk::api::FlagSurfaceSpec::is_option(word)
}
