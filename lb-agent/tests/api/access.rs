//! Who may do what on which listener: the Unix socket serves changes (mode 0600 in a
//! 0700 directory), TCP serves reads to anyone and changes only with the bearer token;
//! the token file's own rules.

use std::os::unix::fs::PermissionsExt;

use crate::util::{GET_SERVICES, TOKEN, drain_request, start, tcp, token_file, unix};
use lb_agent::api::{Limits, Rejection, TokenError, load_token};
use std::sync::atomic::Ordering;

fn mode(p: &std::path::Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[tokio::test]
async fn the_socket_serves_changes_and_only_root_may_open_it() {
    let api = start(Limits::default(), None).await;
    assert_eq!(mode(&api.socket), 0o600, "the socket is root's alone");
    assert_eq!(
        mode(api.socket.parent().unwrap()),
        0o700,
        "its directory, created by the agent, too"
    );
    let (status, text) = unix(&api, &drain_request(None)).await;
    assert_eq!(
        status, 200,
        "a change over the socket needs no token: {text}"
    );
    assert_eq!(api.changes.load(Ordering::Relaxed), 1);
    let (status, _) = unix(&api, GET_SERVICES).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn without_a_token_file_tcp_serves_reads_and_refuses_changes() {
    let api = start(Limits::default(), None).await;
    let (status, _) = tcp(&api, GET_SERVICES).await;
    assert_eq!(status, 200, "reads stay open over TCP");
    let (status, metrics) = tcp(
        &api,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 200);
    let (status, text) = tcp(&api, &drain_request(Some(TOKEN))).await;
    assert_eq!(status, 403, "{text}");
    assert!(
        text.contains("Unix socket"),
        "the refusal says what to use: {text}"
    );
    let reload =
        "POST /api/v1/reload HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    let (status, _) = tcp(&api, reload).await;
    assert_eq!(status, 403, "reload is a change too");
    assert_eq!(
        api.changes.load(Ordering::Relaxed),
        0,
        "nothing reached the agent"
    );
    assert_eq!(api.counters.get(Rejection::ChangesNeedSocket), 2);
    assert!(
        metrics.contains("lb_api_rejected_total{reason=\"changes_need_socket\"}"),
        "{metrics}"
    );
}

#[tokio::test]
async fn with_a_token_tcp_changes_need_the_exact_bearer_token() {
    let dir = crate::util::TempDir::new("token");
    let token = load_token(&token_file(dir.path(), &format!("{TOKEN}\n"), 0o600))
        .expect("a 0600 token file is accepted");
    let api = start(Limits::default(), Some(token)).await;
    for (auth, why) in [
        (None, "no Authorization header"),
        (Some("wrong-token-wrong-token-wrong-tok"), "a wrong token"),
        (Some(&TOKEN[..TOKEN.len() - 1]), "a prefix of the token"),
    ] {
        let (status, text) = tcp(&api, &drain_request(auth)).await;
        assert_eq!(status, 401, "{why}: {text}");
        assert!(text.contains("WWW-Authenticate") || text.contains("www-authenticate"));
    }
    assert_eq!(api.changes.load(Ordering::Relaxed), 0);
    assert_eq!(api.counters.get(Rejection::Unauthorized), 3);
    let (status, text) = tcp(&api, &drain_request(Some(TOKEN))).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(api.changes.load(Ordering::Relaxed), 1);
}

#[test]
fn token_files_others_can_read_or_that_are_short_are_refused() {
    let dir = crate::util::TempDir::new("token-rules");
    let err = load_token(&token_file(dir.path(), TOKEN, 0o644)).unwrap_err();
    assert!(
        matches!(err, TokenError::WorldReadable { mode: 0o644, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("chmod 600"), "{err}");
    let err = load_token(&token_file(dir.path(), TOKEN, 0o602)).unwrap_err();
    assert!(matches!(err, TokenError::WorldReadable { .. }), "{err}");
    let err = load_token(&token_file(dir.path(), "short\n", 0o600)).unwrap_err();
    assert!(matches!(err, TokenError::TooShort { len: 5, .. }), "{err}");
    let ok = load_token(&token_file(dir.path(), TOKEN, 0o640));
    assert!(ok.is_ok(), "group-readable is fine");
    let missing = load_token(&dir.path().join("nope"));
    assert!(matches!(missing, Err(TokenError::Read { .. })));
}

#[tokio::test]
async fn a_live_socket_is_not_taken_over_and_a_stale_one_is_replaced() {
    let api = start(Limits::default(), None).await;
    let cfg = lb_agent::api::ListenConfig {
        socket: Some(api.socket.clone()),
        ..Default::default()
    };
    let (state, _keep) = crate::util::idle_state();
    let err = lb_agent::api::listen(state, cfg.clone())
        .await
        .expect_err("another agent answers on the socket");
    assert!(err.to_string().contains("another agent"), "{err}");

    // A socket file left by a crashed agent (nobody listening).
    let stale = api.dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let (state, _keep2) = crate::util::idle_state();
    let listening = lb_agent::api::listen(
        state,
        lb_agent::api::ListenConfig {
            socket: Some(stale.clone()),
            ..Default::default()
        },
    )
    .await
    .expect("a stale socket is replaced");
    assert!(std::os::unix::net::UnixStream::connect(&stale).is_ok());
    drop(listening);
    assert!(!stale.exists(), "the socket file goes with the agent");
}

/// User `nobody` on the host cannot set a server `down`: the socket refuses it (file
/// permissions) and TCP refuses the change (no token).
#[tokio::test]
async fn user_nobody_cannot_change_a_server() {
    use std::os::unix::process::CommandExt;
    let api = start(Limits::default(), None).await;
    let bin = env!("CARGO_BIN_EXE_lb-agent");
    let socket = api.socket.display().to_string();
    let url = format!("http://{}", api.tcp);
    for args in [
        vec!["server", "down", "web", "10.0.1.1:80", "--socket", &socket],
        vec!["server", "down", "web", "10.0.1.1:80", "--api", &url],
        vec!["reload", "--api", &url],
    ] {
        let out = tokio::task::spawn_blocking({
            let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            move || {
                std::process::Command::new(bin)
                    .args(&args)
                    .uid(65534)
                    .gid(65534)
                    .output()
                    .expect("running lb-agent as nobody")
            }
        })
        .await
        .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} as nobody must fail: {err}");
        assert!(
            err.contains("Permission denied") || err.contains("403"),
            "{args:?}: {err}"
        );
    }
    assert_eq!(
        api.changes.load(Ordering::Relaxed),
        0,
        "nothing reached the agent"
    );
    // Root, through the socket, may.
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(bin)
            .args(["server", "down", "web", "10.0.1.1:80", "--socket", &socket])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(api.changes.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn a_socket_group_gets_group_access() {
    let dir = crate::util::TempDir::new("group");
    let path = dir.path().join("run").join("api.sock");
    let (state, _keep) = crate::util::idle_state();
    let listening = lb_agent::api::listen(
        state,
        lb_agent::api::ListenConfig {
            socket: Some(path.clone()),
            socket_group: Some("daemon".into()),
            ..Default::default()
        },
    )
    .await
    .expect("listening with a group");
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(
        (meta.mode() & 0o777, meta.gid()),
        (0o660, 1),
        "socket 0660 group daemon"
    );
    let dmeta = std::fs::metadata(path.parent().unwrap()).unwrap();
    assert_eq!((dmeta.mode() & 0o777, dmeta.gid()), (0o750, 1));
    drop(listening);
    let (state, _keep) = crate::util::idle_state();
    let err = lb_agent::api::listen(
        state,
        lb_agent::api::ListenConfig {
            socket: Some(dir.path().join("other.sock")),
            socket_group: Some("no-such-group-lb".into()),
            ..Default::default()
        },
    )
    .await
    .expect_err("an unknown group");
    assert!(err.to_string().contains("no group named"), "{err}");
}
