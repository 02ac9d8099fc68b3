//! A command whose reader goes away (`lb-agent check-config … | head -1`) ends quietly,
//! killed by SIGPIPE as Unix tools are, instead of panicking on the failed write.

use std::{
    os::unix::process::ExitStatusExt,
    process::{Command, Stdio},
};

#[test]
fn check_config_into_a_closed_pipe_ends_by_sigpipe_without_a_panic() {
    let dir = std::env::temp_dir().join(format!("lb-broken-pipe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("lb.toml");
    std::fs::write(
        &config,
        "[[service]]\nname = \"web\"\nvip = \"10.0.0.100:80\"\nsnat_ip = \"10.0.0.2\"\n\n\
         [[service.server]]\naddress = \"10.0.1.11:8080\"\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_lb-agent"))
        .args(["check-config", "--config"])
        .arg(&config)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting lb-agent check-config");
    // The reader is gone before the first line is written.
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("waiting for lb-agent");
    std::fs::remove_dir_all(&dir).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "{:?}: {stderr}",
        out.status
    );
}
