//! trybuild cases for `#[singleton]` live in `tests/ui/`.
