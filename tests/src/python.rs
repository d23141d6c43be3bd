//! Running a check script of `tests/python/` (written against the official RocketMQ
//! 5 Python client, which `scripts/test` installs) and judging it by its exit code.

use std::time::Duration;

/// Runs `python3 tests/python/<script> <args>`, killed after `limit`; panics,
/// with its JSON summary and the tail of its stderr, unless it exits 0. Prints
/// its stdout (the summary) either way, and returns it.
pub async fn run_check(script: &str, args: &[&str], limit: Duration) -> String {
    run_check_env(script, args, &[], limit).await
}

/// Where `scripts/test` installs PyPI `rocketmq==0.4.4` (the 4.x remoting
/// client) with `pip install --target`, apart from the 5.x client whose
/// `rocketmq` package would clash with it: `target/py-rocketmq-0.4.4`, or
/// `LEDGERMQ_PY_REMOTING_PATH`. Panics, saying how to install it, if it is
/// not there.
pub fn remoting_client_path() -> String {
    let path = std::env::var("LEDGERMQ_PY_REMOTING_PATH")
        .unwrap_or_else(|_| format!("{}/../target/py-rocketmq-0.4.4", env!("CARGO_MANIFEST_DIR")));
    assert!(
        std::path::Path::new(&path)
            .join("rocketmq/librocketmq.so")
            .exists(),
        "the 4.x Python client is not installed at {path}: run scripts/test, or \
         python3 -m pip install --target {path} rocketmq==0.4.4"
    );
    path
}

/// [`run_check`] with extra environment variables (e.g. `PYTHONPATH`).
pub async fn run_check_env(
    script: &str,
    args: &[&str],
    env: &[(&str, &str)],
    limit: Duration,
) -> String {
    let path = format!("{}/python/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = tokio::time::timeout(
        limit,
        tokio::process::Command::new("python3")
            .arg(&path)
            .args(args)
            .envs(env.iter().copied())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{script} did not finish within {limit:?}"))
    .expect("python3 runs (scripts/test installs the client)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    let tail = stderr.lines().rev().take(30).collect::<Vec<_>>().join("\n");
    assert!(out.status.success(), "{script} failed: {stdout}\n{tail}");
    stdout.into_owned()
}

/// The integer `"key": N` of a one-line JSON summary, if present.
pub fn json_int(summary: &str, key: &str) -> Option<u64> {
    let at = summary.find(&format!("\"{key}\": "))? + key.len() + 4;
    let digits: String = summary[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}
