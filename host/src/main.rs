//! `kata-addons`: the command-line entry point. Maps errors to the exit codes of
//! DESIGN.md §5: 0 ok, 1 operational failure, 2 invalid configuration, 3/4 from `status`.

use std::process::ExitCode;

use clap::Parser;
use kata_addons::cli::Cli;
use kata_addons::policy::PolicyError;

fn main() -> ExitCode {
    let cli = Cli::parse();
    kata_addons::logging::init(cli.global.log_format);
    match kata_addons::run(cli) {
        Ok(code) => code,
        Err(err) => {
            if let Some(PolicyError::Rejected(violations)) = err.downcast_ref::<PolicyError>() {
                eprintln!(
                    "error: invalid configuration ({} problem{}):",
                    violations.len(),
                    if violations.len() == 1 { "" } else { "s" }
                );
                for v in violations {
                    eprintln!("  {}: {} [{}]", v.key, v.message, kata_addons::policy::code_name(v.code));
                }
                return ExitCode::from(2);
            }
            eprintln!("error: {err:#}");
            ExitCode::from(1)
        }
    }
}
