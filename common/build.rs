//! Stamps the git commit the programs are built from into `PS_GIT_COMMIT`, for
//! `candle_ps_build_info`. Outside a git checkout (or without git) it is left
//! unset, and the metric says `unknown`. A `PS_GIT_COMMIT` set in the build's
//! environment wins (for builds from a source archive).

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=PS_GIT_COMMIT");
    println!("cargo:rerun-if-changed=build.rs");
    // HEAD moves to another branch, or the branch to another commit. Only the
    // paths that exist are named: cargo counts a missing one as changed on
    // every build, which recompiled every crate of the workspace above this
    // one at each cargo command in a checkout without packed-refs.
    for path in ["../.git/HEAD", "../.git/refs/heads", "../.git/packed-refs"] {
        if std::path::Path::new(path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    if std::env::var_os("PS_GIT_COMMIT").is_some() {
        return;
    }
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .map(|text| text.trim().to_string())
        .filter(|text| !text.is_empty() && text.bytes().all(|b| b.is_ascii_hexdigit()));
    if let Some(commit) = commit {
        println!("cargo:rustc-env=PS_GIT_COMMIT={commit}");
    }
}
