//! The `flotilla` binary against a running server.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use flotilla::ApplicationStatus;
use support::{start, start_with, test_options, wait_routes, wait_status};

/// Run the binary with `args` (off the runtime, which keeps serving).
async fn flotilla(args: Vec<String>) -> (bool, String, String) {
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .args(&args)
            .env_remove("FLOTILLA_ADDRESS")
            .env_remove("FLOTILLA_TOKEN_FILE")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

/// [`flotilla`], with `input` on its standard input.
async fn flotilla_answering(args: Vec<String>, input: &'static str) -> (bool, String, String) {
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .args(&args)
            .env_remove("FLOTILLA_ADDRESS")
            .env_remove("FLOTILLA_TOKEN_FILE")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

fn args(address: &str, rest: &[&str]) -> Vec<String> {
    let mut v = vec!["--address".to_owned(), address.to_owned()];
    v.extend(rest.iter().map(|s| (*s).to_owned()));
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_status_config_delete_against_a_running_server() {
    let f = start().await;
    let address = f.rest_url("");
    let file = f.dir.path().join("config.yaml");
    std::fs::write(
        &file,
        "applications:\n  - name: cli\n    route_prefix: /cli\n    import_path: t.echo:app\n    args: {tag: from-cli}\n    runtime_env: {env_vars: {MODEL: x}}\n",
    )
    .unwrap();
    let (ok, out, err) = flotilla(args(&address, &["deploy", file.to_str().unwrap()])).await;
    assert!(ok, "{out}{err}");
    assert!(out.contains("Sent deploy request successfully."), "{out}");
    // What the config holds that is not applied is said to the one deploying.
    assert!(
        err.starts_with("Warning: ") && err.contains("runtime_env") && err.contains("env_vars"),
        "{err}"
    );
    wait_status(&f.serve, "cli", ApplicationStatus::Running).await;

    let (ok, out, _) = flotilla(args(&address, &["status"])).await;
    assert!(ok);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("APPLICATION"), "{out}");
    assert!(
        lines[1].starts_with("cli") && lines[1].contains("RUNNING") && lines[1].contains("/cli"),
        "{out}"
    );
    assert!(
        lines[2].contains("ingress")
            && lines[2].contains("HEALTHY")
            && lines[2].contains("1 RUNNING"),
        "{out}"
    );

    let (ok, out, _) = flotilla(args(&address, &["status", "-o", "json"])).await;
    assert!(ok);
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["applications"]["cli"]["status"], "RUNNING");
    assert_eq!(
        j["applications"]["cli"]["deployments"]["ingress"]["replica_states"]["RUNNING"],
        1
    );
    let (ok, out, _) = flotilla(args(&address, &["status", "-o", "yaml"])).await;
    assert!(ok && out.contains("status: RUNNING"), "{out}");
    let (ok, out, _) = flotilla(args(&address, &["status", "-n", "nope"])).await;
    assert!(
        ok && out.contains("Application \"nope\" does not exist."),
        "{out}"
    );

    let (ok, out, _) = flotilla(args(&address, &["config"])).await;
    assert!(ok);
    assert!(
        out.contains("name: cli")
            && out.contains("import_path: t.echo:app")
            && out.contains("tag: from-cli"),
        "{out}"
    );

    // A server error is shown as the server wrote it, with a non-zero exit.
    std::fs::write(
        &file,
        "applications:\n  - name: cli\n    import_pth: t.echo:app\n",
    )
    .unwrap();
    let (ok, _, err) = flotilla(args(&address, &["deploy", file.to_str().unwrap()])).await;
    assert!(!ok);
    assert!(
        err.contains("Request failed with status code 400") && err.contains("import_pth"),
        "{err}"
    );

    let (ok, out, err) = flotilla(args(&address, &["delete", "-y"])).await;
    assert!(
        ok && out.contains("Deleted every application."),
        "{out}{err}"
    );
    wait_routes(&f.serve, |r| r.is_empty()).await;
    let (ok, out, _) = flotilla(args(&address, &["config"])).await;
    assert!(ok && out.contains("No configuration was found."), "{out}");
    f.stop().await;

    // Nobody listening: a clear error, non-zero. The port is held, bound but
    // not listening, so nothing else can take it and every connect is refused
    // (the stopped server's port could be given to another test).
    let held = tokio::net::TcpSocket::new_v4().unwrap();
    held.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let nobody = format!("http://{}", held.local_addr().unwrap());
    let (ok, _, err) = flotilla(args(&nobody, &["status"])).await;
    drop(held);
    assert!(
        !ok && err.contains("Failed to connect to Flotilla at address"),
        "{err}"
    );
}

/// A reader that went away before the output came (`flotilla status | head`
/// with `head` done) is not an error, and nothing panics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_to_a_reader_that_went_away_is_not_an_error() {
    let f = start().await;
    let address = f.rest_url("");
    let (ok, stderr) = tokio::task::spawn_blocking(move || {
        // The pipe's reading end is closed before the binary starts: its
        // first write fails with EPIPE (Rust ignores SIGPIPE).
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .args(args(&address, &["status", "-o", "json"]))
            .env_remove("FLOTILLA_ADDRESS")
            .env_remove("FLOTILLA_TOKEN_FILE")
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap();
    assert!(ok, "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// An error is printed with its causes: a missing file says why it cannot be
/// read. (Nothing is contacted: the file is read first.)
#[tokio::test]
async fn an_error_names_its_cause() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.yaml");
    let (ok, _, err) = flotilla(args(
        "http://127.0.0.1:9",
        &["deploy", missing.to_str().unwrap()],
    ))
    .await;
    let cannot = std::fs::read(&missing).unwrap_err();
    assert!(!ok);
    assert_eq!(
        err,
        format!("Error: cannot read {}: {cannot}\n", missing.display()),
        "{err}"
    );
}

/// A config that never ends (a device) is read up to the server's limit,
/// then refused; and an address whose port is no port (it would send the
/// token to port 80) is refused. Nothing is contacted.
#[tokio::test]
async fn a_config_past_the_limit_and_a_port_that_is_no_port_are_refused() {
    let (ok, _, err) = flotilla(args("http://127.0.0.1:9", &["deploy", "/dev/zero"])).await;
    assert!(!ok);
    assert_eq!(
        err,
        format!(
            "Error: config file /dev/zero is larger than {} bytes\n",
            flotilla::MAX_CONFIG_FILE_BYTES
        )
    );
    let (ok, _, err) = flotilla(args("http://127.0.0.1:99999", &["delete", "-y"])).await;
    assert!(!ok);
    assert!(
        err.contains("its port must be a number from 1 to 65535"),
        "{err}"
    );
    // The help says what the binary is.
    let (ok, out, _) = flotilla(vec!["--help".to_owned()]).await;
    assert!(ok);
    assert!(
        out.starts_with("CLI for managing Flotilla applications through the Serve REST API"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_file_is_sent_as_a_bearer_token() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "t0ken\n").unwrap();
    let f = start_with(test_options().token_file(&token).build().unwrap()).await;
    let address = f.rest_url("");
    let (ok, _, err) = flotilla(args(&address, &["delete", "-y"])).await;
    assert!(!ok && err.contains("status code 401"), "{err}");
    let (ok, out, err) = flotilla(args(
        &address,
        &["--token-file", token.to_str().unwrap(), "delete", "-y"],
    ))
    .await;
    assert!(ok, "{out}{err}");
    f.stop().await;
}

/// A deletion the server committed is a success, even when the look at what
/// is left fails after it (a script would otherwise delete again, or alert,
/// for nothing). The server here is a stub: DELETE answers 200, GET 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_delete_succeeds_when_the_look_after_it_fails() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let stub = tokio::spawn(async move {
        let mut methods = Vec::new();
        while methods.len() < 2 {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut buf = Vec::new();
            // Requests without bodies, one after another on the connection.
            while methods.len() < 2 {
                let mut chunk = [0u8; 1024];
                let n = conn.read(&mut chunk).await.unwrap();
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
                while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    buf.drain(..end + 4);
                    let method = head.split(' ').next().unwrap_or_default().to_owned();
                    let status = if method == "DELETE" {
                        "200 OK"
                    } else {
                        "503 Service Unavailable"
                    };
                    let answer = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n");
                    conn.write_all(answer.as_bytes()).await.unwrap();
                    methods.push(method);
                }
            }
        }
        methods
    });
    let (ok, out, err) = flotilla(args(&address, &["delete", "-y"])).await;
    assert_eq!(stub.await.unwrap(), ["DELETE", "GET"]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("Sent delete request successfully; could not see what is left"),
        "{out}"
    );
}

/// A delete whose confirmation gets no answer (the input ended) deletes
/// nothing and ends the prompt's line. Nothing is contacted.
#[tokio::test]
async fn a_delete_without_an_answer_is_aborted() {
    let (ok, out, err) = flotilla(args("http://127.0.0.1:9", &["delete"])).await;
    assert!(!ok);
    assert!(
        out.ends_with("Do you want to continue? [y/N]: \n"),
        "{out:?}"
    );
    assert_eq!(err, "Error: aborted\n");
}

/// The confirmation reads answers as click's does: any case, an empty line
/// is the default (no), and anything else is asked again. The port it is
/// given is held, bound but not listening: a delete that goes on fails to
/// connect; one that does not is aborted without contacting anything.
#[tokio::test]
async fn a_delete_confirmation_takes_any_case_and_asks_again_after_a_bad_answer() {
    let held = tokio::net::TcpSocket::new_v4().unwrap();
    held.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let nobody = format!("http://{}", held.local_addr().unwrap());
    let delete = || args(&nobody, &["delete"]);
    let (ok, out, err) = flotilla_answering(delete(), "maybe\nYES\n").await;
    assert!(!ok);
    assert_eq!(
        out.matches("Do you want to continue? [y/N]: ").count(),
        2,
        "{out:?}"
    );
    assert!(out.contains("Error: invalid input\n"), "{out:?}");
    assert!(
        err.contains("Failed to connect to Flotilla at address"),
        "went on, and could not connect: {err}"
    );
    for no in ["\n", "No\n", "huh\nn\n"] {
        let (ok, _, err) = flotilla_answering(delete(), no).await;
        assert!(!ok, "{no:?}");
        assert_eq!(err, "Error: aborted\n", "{no:?}");
    }
}
