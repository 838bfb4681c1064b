//! The gateway's admin page when it runs on its own, `assay serve gateway` (every port 0, on
//! loopback): with no `auth_token` it generates a token and prints it once, in the page's URL;
//! `admin.no_auth` serves it open; `ASSAY__ADMIN__ALLOWED_HOSTS` adds Host names.

use std::process::{Command, Stdio};
use std::time::Duration;

use assay_testkit::{ChildOutput, http_request as http};

/// The gateway with `env`; the running child and its printed admin URL (when `printed`, else the
/// address it logged).
fn gateway(env: &[(&str, &str)], printed: bool) -> (ChildOutput, String) {
    let mut out = ChildOutput::spawn(
        Command::new(env!("CARGO_BIN_EXE_assay"))
            .args(["serve", "gateway"])
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
            .stderr(Stdio::piped()),
        "assay serve gateway",
    );
    let url = out.wait_for(Duration::from_secs(60), "admin page address", |line| {
        if let Some(url) = line.strip_prefix("admin page: ") {
            return Some(url.to_string());
        }
        let addr = line.split("addr=").nth(1).and_then(|r| r.split_whitespace().next());
        addr.filter(|_| !printed && line.contains("admin page listening")).map(|a| format!("http://{a}/"))
    });
    (out, url)
}

const JSON: (&str, &str) = ("Content-Type", "application/json");

#[test]
fn the_gateway_generates_a_token_prints_it_once_and_requires_it() {
    let (out, url) = gateway(&[("ASSAY__ADMIN__ALLOWED_HOSTS", "admin.example,other.example:8443")], true);
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

    let lines = out.stop();
    let with_token: Vec<&String> = lines.iter().filter(|l| l.contains(token)).collect();
    assert_eq!(with_token.len(), 1, "the token shows on the admin page line only: {with_token:?}");
}

#[test]
fn the_gateway_serves_the_page_open_only_when_the_config_says_so() {
    let (out, url) = gateway(&[("ASSAY__ADMIN__NO_AUTH", "true")], false);
    assert!(!url.contains("#token="), "{url}");
    let addr = url.strip_prefix("http://").and_then(|u| u.strip_suffix('/')).expect("http url").to_string();
    let (status, body) = http(&addr, &addr, "POST", "/api/ListRuns", &[JSON], "{}");
    assert_eq!(status, 200, "open: {body}");
    let (status, _) = http(&addr, &addr, "POST", "/api/ListRuns", &[("Content-Type", "text/plain")], "{}");
    assert_eq!(status, 415);
    let (status, _) = http(&addr, "evil.example", "POST", "/api/ListRuns", &[JSON], "{}");
    assert_eq!(status, 403);
    let lines = out.stop();
    assert!(lines.iter().any(|l| l.contains("admin page served with no token")), "a warning: {lines:?}");
}
