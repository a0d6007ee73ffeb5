//! Every program speaks one CLI style: `-V` names the program and its version, and
//! `-h` and `--help` print the same compact help (no program or subcommand
//! switches to clap's long layout).

use std::process::Command;

use ps_tests::binary;

/// Each program and the subcommands a user runs.
const COMMANDS: [&[&str]; 17] = [
    &["ps-server"],
    &["ps-server", "export"],
    &["ps-scheduler"],
    &["ps-scheduler", "status"],
    &["ps-scheduler", "plan"],
    &["ps-scheduler", "plan-env"],
    &["ps-worker"],
    &["ps-local"],
    &["ps-microbench", "latency"],
    &["ps-microbench", "bandwidth"],
    &["ps-microbench", "ps-throughput"],
    &["ps-microbench", "tcp-check"],
    &["ps-microbench", "serve"],
    &["ps-testbed", "run"],
    &["ps-testbed", "plan-check"],
    &["ps-testbed", "clean"],
    &["ps-testbed", "calibrate"],
];

fn stdout(program: &str, args: &[&str]) -> String {
    let output = Command::new(binary(program))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    assert!(output.status.success(), "{program} {args:?} failed");
    String::from_utf8(output.stdout).expect("utf-8 help")
}

#[test]
fn every_program_prints_one_help_style_and_its_own_name() {
    for command in COMMANDS {
        let (program, sub) = (command[0], &command[1..]);
        let short = stdout(program, &[sub, &["-h"]].concat());
        let long = stdout(program, &[sub, &["--help"]].concat());
        assert_eq!(short, long, "{command:?}: -h and --help differ");
        if sub.is_empty() {
            let version = stdout(program, &["-V"]);
            assert_eq!(
                version.trim(),
                format!("{program} {}", env!("CARGO_PKG_VERSION")),
                "{program} -V"
            );
        }
    }
}
