//! Pods sharing one SQLite lease table (placeholder until the engine lands).

fn main() {}
