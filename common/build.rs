//! Stamps the git commit the programs are built from into `PS_GIT_COMMIT`, for
//! `candle_ps_build_info`. Outside a git checkout (or without git) it is left
//! unset, and the metric says `unknown`. A `PS_GIT_COMMIT` set in the build's
//! environment wins (for builds from a source archive).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=PS_GIT_COMMIT");
    println!("cargo:rerun-if-changed=build.rs");
    // HEAD moves to another branch, or the branch to another commit. Only the
    // paths that exist are named: cargo counts a missing one as changed on
    // every build, which recompiled every crate of the workspace above this
    // one at each cargo command in a checkout without packed-refs.
    for path in moved_by_a_commit() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    if std::env::var_os("PS_GIT_COMMIT").is_some() {
        return;
    }
    if let Some(commit) = git(&["rev-parse", "--short=12", "HEAD"])
        .filter(|text| !text.is_empty() && text.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        println!("cargo:rustc-env=PS_GIT_COMMIT={commit}");
    }
}

/// The files a commit or a checkout changes: this checkout's `HEAD`, and the
/// repository's branch heads, loose and packed (a worktree's or a
/// submodule's included, whose `.git` is a file); those that exist.
fn moved_by_a_commit() -> Vec<PathBuf> {
    let (Some(own), Some(common)) = (
        git(&["rev-parse", "--git-dir"]),
        git(&["rev-parse", "--git-common-dir"]),
    ) else {
        return Vec::new();
    };
    let (own, common) = (PathBuf::from(own), PathBuf::from(common));
    [
        own.join("HEAD"),
        common.join("refs/heads"),
        common.join("packed-refs"),
    ]
    .into_iter()
    .filter(|path| path.exists())
    .collect()
}

/// What `git ARGS` prints, trimmed, run in this package's folder; `None`
/// without git or outside a checkout.
fn git(args: &[&str]) -> Option<String> {
    Command::new("git")
        .args(args)
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .map(|text| text.trim().to_string())
}
