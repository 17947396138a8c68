//! x
pub fn v() -> String { String::new() }
