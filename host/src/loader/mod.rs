//! Loaders turn a plugin's artifact into callable code. Only the native
//! loader exists so far; WebAssembly components arrive with their own issue.

pub mod native;
