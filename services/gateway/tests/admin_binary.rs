//! The standalone `assay-gateway` binary's admin page (every port 0, on loopback): with no
//! `auth_token` it generates a token and prints it once, in the page's URL; `admin.no_auth` serves
//! it open; `ASSAY__ADMIN__ALLOWED_HOSTS` adds Host names.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The gateway with `env`; the child, its printed admin URL (when `printed`, else the address it
/// logged), the lines so far and the channel of the rest of its output.
fn gateway(env: &[(&str, &str)], printed: bool) -> (Child, String, Vec<String>, mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_assay-gateway"))
        .env("ASSAY__BIND", "127.0.0.1")
        .env("ASSAY__PORTS__GATEWAY", "0")
        .env("ASSAY__PORTS__ADMIN", "0")
        .env("ASSAY__GATEWAY__STORE", ":memory:")
        .env_remove("ASSAY_AUTH_TOKEN")
        .env_remove("ASSAY__AUTH_TOKEN")
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("assay-gateway starts");
    let (tx, rx) = mpsc::channel();
    for out in [
        Box::new(child.stderr.take().expect("stderr")) as Box<dyn Read + Send>,
        Box::new(child.stdout.take().expect("stdout")),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
    }
    let mut seen = Vec::new();
    loop {
        let Ok(line) = rx.recv_timeout(Duration::from_secs(60)) else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("no admin page address within 60 s:\n{}", seen.join("\n"));
        };
        seen.push(line.clone());
        if let Some(url) = line.strip_prefix("admin page: ") {
            return (child, url.to_string(), seen, rx);
        }
        if !printed && line.contains("admin page listening") {
            let addr = line.split("addr=").nth(1).and_then(|r| r.split_whitespace().next()).expect("addr");
            return (child, format!("http://{addr}/"), seen, rx);
        }
    }
}

/// One HTTP/1.1 request to `addr` with `Host: host`: (status, body).
fn http(addr: &str, host: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the admin page");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req =
        format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

fn stop(mut child: Child, rx: mpsc::Receiver<String>, mut seen: Vec<String>) -> Vec<String> {
    child.kill().expect("kill");
    child.wait().expect("wait");
    seen.extend(rx.iter());
    seen
}

const JSON: (&str, &str) = ("Content-Type", "application/json");

#[test]
fn the_gateway_generates_a_token_prints_it_once_and_requires_it() {
    let (child, url, seen, rx) = gateway(&[("ASSAY__ADMIN__ALLOWED_HOSTS", "admin.example,other.example:8443")], true);
    let (base, token) = url.split_once("/#token=").unwrap_or_else(|| panic!("no #token= in {url}"));
    assert!(token.len() >= 32 && token.chars().all(|c| c.is_ascii_hexdigit()), "{token}");
    let addr = base.strip_prefix("http://").expect("http url");

    let (status, body) = http(addr, addr, "GET", "/api/config", &[], "");
    assert!(status == 200 && body.contains(r#""authRequired":true"#), "{status} {body}");
    let (status, body) = http(addr, addr, "POST", "/api/ListRuns", &[JSON], "{}");
    assert_eq!(status, 401, "no token: {body}");
    let bearer = format!("Bearer {token}");
    let auth = ("Authorization", bearer.as_str());
    let (status, body) = http(addr, addr, "POST", "/api/ListRuns", &[JSON, auth], "{}");
    assert_eq!(status, 200, "the printed token: {body}");
    // Hosts: the configured names (from the environment, a list) are answered, others are not.
    for (host, expected) in
        [("admin.example", 200), ("other.example:8443", 200), ("other.example", 403), ("evil.example", 403)]
    {
        let (status, body) = http(addr, host, "POST", "/api/ListRuns", &[JSON, auth], "{}");
        assert_eq!(status, expected, "Host {host}: {body}");
    }

    let lines = stop(child, rx, seen);
    let with_token: Vec<&String> = lines.iter().filter(|l| l.contains(token)).collect();
    assert_eq!(with_token.len(), 1, "the token shows on the admin page line only: {with_token:?}");
}

#[test]
fn the_gateway_serves_the_page_open_only_when_the_config_says_so() {
    let (child, url, seen, rx) = gateway(&[("ASSAY__ADMIN__NO_AUTH", "true")], false);
    assert!(!url.contains("#token="), "{url}");
    let addr = url.strip_prefix("http://").and_then(|u| u.strip_suffix('/')).expect("http url").to_string();
    let (status, body) = http(&addr, &addr, "POST", "/api/ListRuns", &[JSON], "{}");
    assert_eq!(status, 200, "open: {body}");
    let (status, _) = http(&addr, &addr, "POST", "/api/ListRuns", &[("Content-Type", "text/plain")], "{}");
    assert_eq!(status, 415);
    let (status, _) = http(&addr, "evil.example", "POST", "/api/ListRuns", &[JSON], "{}");
    assert_eq!(status, 403);
    let lines = stop(child, rx, seen);
    assert!(lines.iter().any(|l| l.contains("admin page served with no token")), "a warning: {lines:?}");
}
