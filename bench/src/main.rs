//! `cargo run -p lease-bench --release -- [--quick] [--only PgTable,Redis,...] [--write docs/PERFORMANCE.md]`
//!
//! Prints the report; with `--write FILE`, also puts it into FILE between
//! `<!-- bench:begin -->` and `<!-- bench:end -->`, keeping the rest, and
//! the plots it embeds into `img/` beside FILE. Exits
//! with an error (status 1) when a check is not met: the report, with its
//! table of checks, is printed (and written) first.

#![allow(clippy::print_stderr)]

use std::process::ExitCode;

use lease_bench::{BoxError, Options, run, splice, write_plots};

const USAGE: &str = "usage: lease-bench [--quick] [--only BACKEND,...] [--sections rt,overhead,contention,scale,handover,check_in,engine] [--write FILE]";

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    let mut options = Options {
        command: std::iter::once("cargo run -p lease-bench --release --".to_owned())
            .chain(std::env::args().skip(1))
            .collect::<Vec<_>>()
            .join(" "),
        ..Options::default()
    };
    let mut write = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => options.quick = true,
            "--only" => {
                let list = args.next().ok_or(USAGE)?;
                options.only = list.split(',').map(str::to_owned).collect();
            }
            "--sections" => {
                let list = args.next().ok_or(USAGE)?;
                options.sections = list.split(',').map(str::to_owned).collect();
            }
            "--write" => write = Some(args.next().ok_or(USAGE)?),
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(ExitCode::SUCCESS);
            }
            other => return Err(format!("unknown argument {other:?}\n{USAGE}").into()),
        }
    }
    let report = run(&options).await?;
    println!("{}", report.markdown);
    if let Some(path) = write {
        let doc = std::fs::read_to_string(&path).unwrap_or_default();
        std::fs::write(&path, splice(&doc, &report.markdown))?;
        write_plots(&report.plots, std::path::Path::new(&path))?;
        eprintln!("wrote {path} and its plots");
    }
    let violations = report.violations();
    for v in &violations {
        eprintln!("NOT MET: {v}");
    }
    if violations.is_empty() {
        eprintln!("all {} checks met", report.checks.len());
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "error: {} of {} checks not met",
            violations.len(),
            report.checks.len()
        );
        Ok(ExitCode::FAILURE)
    }
}
