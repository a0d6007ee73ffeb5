//! `ps-testbed` refuses a cluster it cannot build before it makes anything:
//! these run as any user, with no namespace created. (As a test of this
//! package, it also makes `cargo test` build `ps-testbed` with the rest of
//! the workspace, instead of a test building it later on its own.)

use std::process::Command;

fn refused(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_ps-testbed"))
        .args(args)
        .output()
        .expect("run ps-testbed");
    assert_eq!(output.status.code(), Some(2), "{args:?}: {output:?}");
    assert!(output.stdout.is_empty(), "{args:?}: {output:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn a_cluster_of_two_scheduler_hosts_is_refused_naming_why() {
    let said = refused(&["run", "--hosts", "scheduler=2,server=1,worker=1"]);
    assert!(
        said.contains("a cluster has exactly one scheduler host, not 2"),
        "{said}"
    );
}

#[test]
fn hosts_without_workers_or_with_an_unknown_role_are_refused() {
    let said = refused(&["run", "--hosts", "server=1"]);
    assert!(said.contains("--hosts needs worker=N"), "{said}");
    let said = refused(&["run", "--hosts", "server=1,worker=1,gpu=1"]);
    assert!(said.contains("unknown role \"gpu\""), "{said}");
}

#[test]
fn a_plan_check_grid_with_a_part_size_outside_the_planners_range_is_refused() {
    let said = refused(&["plan-check", "--partitions", "1KiB"]);
    assert!(said.contains("--partitions"), "{said}");
}
