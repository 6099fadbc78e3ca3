//! trybuild cases for `#[singleton]`: see `tests/ui.rs` and `README.md`.
//!
//! Regenerate the `.stderr` files with
//! `TRYBUILD=overwrite cargo test -p lease-ui-tests`.
