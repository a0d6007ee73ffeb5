//! On/off flags that can also be set from the environment. clap takes only
//! `true` and `false` from a flag's variable by default, so `PS_JSON=1` stopped
//! a program with "invalid value"; [`env_flag`] takes the spellings people
//! write in shells and compose files as well.

use clap::builder::BoolishValueParser;

/// The value parser of every on/off flag bound to a `PS_*` variable: `1`,
/// `true`, `yes`, `on` (and `y`, `t`) turn it on; `0`, `false`, `no`, `off` (and
/// `n`, `f`) leave it off; anything else is an error naming the flag.
pub fn env_flag() -> BoolishValueParser {
    BoolishValueParser::new()
}

/// The on/off flags of `command` and of its subcommands that are bound to a
/// variable but would refuse `VARIABLE=1`: what a program's tests check is empty.
pub fn env_flags_refusing_one(command: &clap::Command) -> Vec<String> {
    let refusing = command.get_arguments().filter(|arg| {
        let on_off = matches!(arg.get_action(), clap::ArgAction::SetTrue);
        // clap's own parser lists `true` and `false` as its only values; ours lists none.
        let listed = arg.get_possible_values();
        let refuses_one =
            !listed.is_empty() && !listed.iter().any(|value| value.matches("1", true));
        on_off && arg.get_env().is_some() && refuses_one
    });
    refusing
        .map(|arg| format!("{} --{}", command.get_name(), arg.get_id()))
        .chain(command.get_subcommands().flat_map(env_flags_refusing_one))
        .collect()
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Args {
        #[arg(long, value_parser = env_flag(), num_args = 0..=1, default_missing_value = "true")]
        json: bool,
    }

    fn json(args: &[&str]) -> Result<bool, clap::Error> {
        Args::try_parse_from(std::iter::once("program").chain(args.iter().copied())).map(|a| a.json)
    }

    #[test]
    fn the_flag_alone_turns_it_on_and_its_absence_leaves_it_off() {
        assert!(json(&["--json"]).unwrap());
        assert!(!json(&[]).unwrap());
    }

    #[test]
    fn the_shell_spellings_parse_and_others_are_refused() {
        for (text, expected) in [("1", true), ("yes", true), ("on", true), ("true", true)]
            .into_iter()
            .chain([
                ("0", false),
                ("no", false),
                ("off", false),
                ("false", false),
            ])
        {
            assert_eq!(
                json(&[&format!("--json={text}")]).unwrap(),
                expected,
                "{text}"
            );
        }
        assert!(json(&["--json=maybe"]).is_err());
    }

    #[test]
    fn a_flag_with_clap_s_own_parser_is_named_as_refusing_one() {
        #[derive(Debug, Parser)]
        struct Plain {
            #[arg(long, env = "PS_FLAG_TEST_PLAIN")]
            plain: bool,
            #[arg(long, env = "PS_FLAG_TEST_SHELL", value_parser = env_flag())]
            shell: bool,
        }
        let command = <Plain as clap::CommandFactory>::command().name("program");
        assert_eq!(env_flags_refusing_one(&command), ["program --plain"]);
    }
}
