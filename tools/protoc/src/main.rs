//! Runs the `protoc` shipped by the `protoc-bin-vendored` crate with the
//! arguments given, plus the include path of the well-known types. See
//! `Cargo.toml` beside this file for why.

use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let (protoc, include) = match (
        protoc_bin_vendored::protoc_bin_path(),
        protoc_bin_vendored::include_path(),
    ) {
        (Ok(protoc), Ok(include)) => (protoc, include),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("lease-protoc: no vendored protoc for this platform: {e}; set PROTOC to a protoc binary");
            return ExitCode::FAILURE;
        }
    };
    // The caller's include paths come first; the well-known types last.
    let status = Command::new(&protoc)
        .args(std::env::args_os().skip(1))
        .arg("-I")
        .arg(&include)
        .status();
    match status {
        Ok(status) if status.success() => ExitCode::SUCCESS,
        Ok(status) => ExitCode::from(u8::try_from(status.code().unwrap_or(1)).unwrap_or(1)),
        Err(e) => {
            eprintln!("lease-protoc: cannot run {}: {e}", protoc.display());
            ExitCode::FAILURE
        }
    }
}
