//! One file per command: argument parsing and the command's top-level flow. The work
//! itself lives in the domain modules.

pub mod agent;
pub mod cancel;
pub mod check;
pub mod clean;
pub mod compare;
pub mod completions;
pub mod daemon;
pub mod export;
pub mod gym;
pub mod init;
pub mod install_units;
pub mod judge;
pub mod log;
pub mod pause;
pub mod priority;
pub mod queue;
pub mod restart;
pub mod run;
pub mod runs;
pub mod serve;
pub mod setup;
pub mod shard;
pub mod sim_serve;
pub mod start;
pub mod status;
pub mod study;
pub mod train;
pub mod wait;

/// `--jobs`: a count of cases in flight, checked as every such count is.
pub fn jobs_parser(text: &str) -> Result<usize, String> {
    let jobs = text.parse().map_err(|_| format!("{text:?} is not a whole number of cases"))?;
    pruefstand_core::settings::check_in_flight("--jobs", jobs)
}

/// A name that becomes a folder under `reports/`.
pub fn name_parser(text: &str) -> Result<String, String> {
    pruefstand_core::input::check_name(text)?;
    Ok(text.to_string())
}

/// The command line, parsed; on a mistake clap's error (exit 2), with a guess for a
/// mistyped command that clap's own similarity misses — `rn` for `run` — from the
/// visible commands by edit distance (`input::closest`).
pub fn parse<P: clap::Parser>() -> P {
    P::try_parse().unwrap_or_else(|err| with_guess(err, &P::command()).exit())
}

/// Other tools' words for one of our commands (pueue's and a shell's `kill`, Slurm's
/// `scancel`): far from ours by spelling, so the distance alone never guesses them.
const SYNONYMS: &[(&str, &str)] =
    &[("kill", "cancel"), ("stop", "cancel"), ("abort", "cancel"), ("scancel", "cancel"), ("follow", "log")];

fn with_guess(mut err: clap::Error, command: &clap::Command) -> clap::Error {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if err.kind() != ErrorKind::InvalidSubcommand {
        return err;
    }
    let Some(ContextValue::String(typed)) = err.get(ContextKind::InvalidSubcommand) else { return err };
    let names: Vec<String> =
        command.get_subcommands().filter(|c| !c.is_hide_set()).map(|c| c.get_name().to_string()).collect();
    // A synonym wins over clap's guess by spelling (`stop` is nearer `setup`).
    let synonym = SYNONYMS.iter().find(|(other, ours)| other == typed && names.iter().any(|n| n == ours));
    let guess = match synonym {
        Some((_, ours)) => Some(*ours),
        None if err.get(ContextKind::SuggestedSubcommand).is_some() => return err,
        None => pruefstand_core::input::closest(typed, &names),
    };
    if let Some(guess) = guess {
        err.insert(ContextKind::SuggestedSubcommand, ContextValue::String(guess.to_string()));
    }
    err
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser, Debug)]
    #[command(name = "t")]
    enum Cli {
        Run,
        Restart,
        Status,
        #[command(hide = true)]
        Rm,
    }

    fn guess(typed: &str) -> Option<String> {
        use clap::{CommandFactory, Parser};
        let err = Cli::try_parse_from(["t", typed]).unwrap_err();
        match with_guess(err, &Cli::command()).get(clap::error::ContextKind::SuggestedSubcommand) {
            Some(clap::error::ContextValue::String(guess)) => Some(guess.clone()),
            Some(other) => Some(other.to_string()),
            None => None,
        }
    }

    #[test]
    fn a_mistyped_command_gets_the_nearest_visible_one() {
        assert_eq!(guess("rn").as_deref(), Some("run"), "clap alone misses this one");
        assert!(guess("stauts").is_some_and(|g| g.contains("status")), "clap's own guesses stay");
        assert_eq!(guess("xyzzy"), None);
        assert_eq!(guess("kill"), None, "no `cancel` here to name");
    }
}
