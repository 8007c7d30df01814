//! One file per command: argument parsing and the command's top-level flow. The work
//! itself lives in the domain modules.

pub(crate) mod agent;
pub(crate) mod cancel;
pub(crate) mod check;
pub(crate) mod clean;
pub(crate) mod compare;
pub(crate) mod completions;
pub(crate) mod daemon;
pub(crate) mod export;
pub(crate) mod gym;
pub(crate) mod init;
pub(crate) mod install_units;
pub(crate) mod judge;
pub(crate) mod log;
pub(crate) mod pause;
pub(crate) mod priority;
pub(crate) mod queue;
pub(crate) mod restart;
pub(crate) mod run;
pub(crate) mod runs;
pub(crate) mod serve;
pub(crate) mod setup;
pub(crate) mod shard;
pub(crate) mod show;
pub(crate) mod sim_serve;
pub(crate) mod start;
pub(crate) mod start_night;
pub(crate) mod start_training;
pub(crate) mod status;
pub(crate) mod study;
pub(crate) mod train;
pub(crate) mod wait;

/// `--jobs`: a count of cases in flight, checked as every such count is.
fn jobs_parser(text: &str) -> Result<usize, String> {
    let jobs = text.parse().map_err(|_| format!("{text:?} is not a whole number of cases"))?;
    pruefstand_core::settings::check_in_flight("--jobs", jobs)
}

/// A name that becomes a folder under `reports/`.
fn name_parser(text: &str) -> Result<String, String> {
    pruefstand_core::input::check_name(text)?;
    Ok(text.to_string())
}

/// The command line, parsed; on a mistake clap's error (exit 2), with a guess for a
/// mistyped command that clap's own similarity misses — `rn` for `run` — from the
/// visible commands by edit distance (`input::closest`). `--plan`'s help names the
/// plans of the bench root the command would use ([`with_plans`]).
pub(crate) fn parse<P: clap::Parser>() -> P {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let command = with_plans(P::command(), &args);
    let parsed = command
        .clone()
        .try_get_matches_from(&args)
        .and_then(|mut matches| <P as clap::FromArgMatches>::from_arg_matches_mut(&mut matches));
    parsed.unwrap_or_else(|err| with_guess(err.format(&mut command.clone()), &command).exit())
}

/// Every `--plan`'s help with the plans there are: the profiles of the bench root
/// found as the command will find it (`--root`, `PRUEFSTAND_ROOT`, or a parent of the
/// working directory) — the shipped ones and the user's own, never a list written
/// into the source that goes stale.
fn with_plans(command: clap::Command, args: &[std::ffi::OsString]) -> clap::Command {
    let profiles = root_for_help(args).map(|root| root.join("profiles"));
    let mut names: Vec<String> = profiles
        .as_ref()
        .and_then(|dir| std::fs::read_dir(dir).ok())
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "toml"))
                .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    let list = match (&profiles, names.is_empty()) {
        (Some(dir), false) => format!("{} ({})", dir.display(), names.join(", ")),
        (Some(dir), true) => format!("{} (none there yet)", dir.display()),
        (None, _) => "the bench root's profiles/ (no bench root here)".to_string(),
    };
    let subcommands: Vec<String> = command
        .get_subcommands()
        .filter(|c| c.get_arguments().any(|a| a.get_id() == "plan"))
        .map(|c| c.get_name().to_string())
        .collect();
    subcommands.into_iter().fold(command, |command, name| {
        // Where `--plan` only names the plan to run, its help is the list; elsewhere
        // (`check`) the list follows the help's own words.
        let only_names = matches!(name.as_str(), "run" | "start" | "gym");
        command.mut_subcommand(name, |sub| {
            sub.mut_arg("plan", |arg| {
                let own = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
                let own = if own.ends_with('.') { own } else { format!("{own}.") };
                let help = if only_names {
                    format!("A plan: a name from {list}, or a plan file.")
                } else {
                    format!("{own} Plans here: {list}.")
                };
                arg.help(help.clone()).long_help(help)
            })
        })
    })
}

/// The bench root a command given `args` would use, if there is one: `--root DIR`
/// (or `--root=DIR`), else `PRUEFSTAND_ROOT`, else the nearest parent of the working
/// directory holding a pruefstand.toml.
fn root_for_help(args: &[std::ffi::OsString]) -> Option<std::path::PathBuf> {
    let mut words = args.iter().skip(1).map(|a| a.to_string_lossy());
    let mut explicit = None;
    while let Some(word) = words.next() {
        if word == "--" {
            break;
        }
        if word == "--root" {
            explicit = words.next().map(|w| std::path::PathBuf::from(w.as_ref()));
        } else if let Some(dir) = word.strip_prefix("--root=") {
            explicit = Some(std::path::PathBuf::from(dir));
        }
    }
    let explicit = explicit.or_else(|| std::env::var_os("PRUEFSTAND_ROOT").map(std::path::PathBuf::from));
    match explicit {
        Some(dir) => Some(dir),
        None => {
            let cwd = std::env::current_dir().ok()?;
            cwd.ancestors().find(|d| d.join(pruefstand_core::root::CONFIG_FILE).is_file()).map(|d| d.to_path_buf())
        }
    }
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
