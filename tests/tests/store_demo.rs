//! Runs the README's first command (the store demo) as a real process and checks its
//! verdict, so CI proves the README.

use std::process::Command;

fn run_demo(flush: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_store-demo"))
        .args([
            "--messages",
            "3000",
            "--flush",
            flush,
            "--segment-bytes",
            "1048576",
        ])
        .output()
        .expect("running store-demo");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "store-demo failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn store_demo_recovers_every_acknowledged_message() {
    for flush in ["sync", "async"] {
        let out = run_demo(flush);
        assert!(
            out.contains("lost 0, duplicated 0, order kept: yes"),
            "{out}"
        );
        assert!(
            out.contains("clean shutdown: false"),
            "the demo must really crash: {out}"
        );
        assert!(out.contains("clean=true"), "{out}");
    }
}
