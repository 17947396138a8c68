#!/usr/bin/env python3
"""Plays a plugin-api 1.x minor release on a copy of `wire.rs`: adds a field
to every `#[non_exhaustive]` struct (and to plugin-api's own literals of it,
as the release would), the kind of addition that once broke plugin sources
("missing field `ranks` in initializer of `LaunchPlan`").

Usage: add_dummy_fields.py PATH/TO/wire.rs  (edits it in place; prints the
structs it changed).
"""
import re
import sys

FIELD = "dummy_1_x_addition"

path = sys.argv[1]
text = open(path).read()

# Structs marked #[non_exhaustive] (attributes may stand between).
names = re.findall(r"#\[non_exhaustive\]\n(?:\s*#\[[^\n]*\]\n)*\s*pub struct (\w+) \{", text)
if not names:
    sys.exit(f"{path}: no #[non_exhaustive] struct found")

for name in names:
    # The definition: a new optional field first, as a 1.x release adds one.
    text = re.sub(
        rf"(pub struct {name} \{{\n)",
        rf"\1    /// Added by the source-compatibility check.\n    #[serde(default)]\n    pub {FIELD}: Option<u8>,\n",
        text,
        count=1,
    )
    # plugin-api's own literals of it (its constructors) get the field too.
    text = re.sub(
        rf"(?<!struct )(?<!impl )(?<!for )(?<![\w:])({name} \{{\n)(\s*)",
        rf"\1\2{FIELD}: None,\n\2",
        text,
    )

open(path, "w").write(text)
print(" ".join(names))
