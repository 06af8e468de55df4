//! `kata-addons`: the command-line entry point. Maps errors to the exit codes of
//! DESIGN.md §5: 0 ok, 1 operational failure, 2 invalid configuration, 3/4 from `status`,
//! 64 command-line usage error.

use std::process::ExitCode;

use clap::Parser;
use kata_addons::cli::Cli;
use kata_addons::policy::PolicyError;

/// `EX_USAGE` from sysexits.h: the command line itself is wrong.
const EX_USAGE: u8 = 64;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp
                | clap::error::ErrorKind::DisplayVersion
                | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => ExitCode::SUCCESS,
                _ => ExitCode::from(EX_USAGE),
            };
        }
    };
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
            if kata_addons::configmap::is_invalid_config(&err) { ExitCode::from(2) } else { ExitCode::from(1) }
        }
    }
}
