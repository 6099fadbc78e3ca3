//! The `#[singleton]` attribute macro; see the `lease` crate.
