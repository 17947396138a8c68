//! Text output shared by every report: one table style for `hangar`'s
//! commands and the conformance suite.

use comfy_table::{presets::NOTHING, ContentArrangement, Table};

/// A table in the style of every `hangar` command: no borders, one row a
/// line, columns as wide as their widest cell.
pub fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.to_vec());
    t
}
