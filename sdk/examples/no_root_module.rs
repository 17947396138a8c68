//! A shared library that is not a Hangar plugin: it exports no root module.

/// Something a library might contain.
pub fn not_a_plugin() -> i32 {
    42
}
