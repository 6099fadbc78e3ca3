//! Compile-pass and compile-fail cases of `#[singleton]`.
//!
//! `tests/ui/pass/*.rs` must compile (and their `main` must run);
//! `tests/ui/fail/*.rs` must fail with exactly the error in the `.stderr`
//! file next to them.
//!
//! After changing an error message (or the toolchain), regenerate the
//! `.stderr` files and review the diff before committing:
//!
//! ```sh
//! TRYBUILD=overwrite cargo test -p lease-ui-tests
//! ```

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
