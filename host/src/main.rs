//! `kata-addons`: the command-line entry point. Maps errors to the exit codes of
//! docs/design.md#exit-codes through the one error model (`kata_addons::error`): 0 ok, 1
//! operational failure, 2 invalid configuration, 3/4 from `status`, 64 command-line usage
//! error.

use std::process::ExitCode;

use clap::Parser;
use kata_addons::cli::Cli;
use kata_addons::error::EX_USAGE;

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
    kata_addons::logging::init(cli.global.log_format.into());
    match kata_addons::run(cli) {
        Ok(code) => code,
        Err(err) => ExitCode::from(kata_addons::error::report(&err)),
    }
}
