//! `assay up` and its admin page's token, end to end (the binary on loopback, every port 0): with
//! no `auth_token` a token is generated per start and printed once, in the page's URL; only
//! `--no-admin-auth` serves the page open.

use std::process::{Command, Stdio};
use std::time::Duration;

use assay_testkit::{ChildOutput, http_request};

/// `assay up` with `args`, every port free; the running child and the admin page's printed URL.
fn up(dir: &std::path::Path, args: &[&str]) -> (ChildOutput, String) {
    let config = dir.join("assay.toml");
    std::fs::write(
        &config,
        "bind = \"127.0.0.1\"\ndrain_seconds = 1\n[ports]\ngateway = 0\ngenerator = 0\nrefiners = 0\nscorer = 0\n\
         arbiter = 0\ndelta_judge = 0\ndebate = 0\nadmin = 0\n[gateway]\nstore = \":memory:\"\n\
         [backends.openai]\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"scripted\"\n\
         [models.default]\nbackend = \"openai\"\n[cache]\nenabled = false\n",
    )
    .unwrap();
    let mut out = ChildOutput::spawn(
        Command::new(env!("CARGO_BIN_EXE_assay"))
            .arg("--config")
            .arg(&config)
            .arg("up")
            .args(args)
            .env("OPENAI_API_KEY", "test")
            .env_remove("OPENAI_BASE_URL")
            .env_remove("ASSAY_AUTH_TOKEN")
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
        "assay up",
    );
    let url = out
        .wait_for(Duration::from_secs(60), "admin page line", |l| l.strip_prefix("admin page: ").map(str::to_string));
    (out, url)
}

/// One HTTP/1.1 request with the address as its Host: (status, body).
fn http(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    http_request(addr, addr, method, path, headers, body)
}

const JSON: (&str, &str) = ("Content-Type", "application/json");

#[test]
fn up_generates_a_token_prints_it_once_in_the_url_and_requires_it() {
    let dir = tempfile::tempdir().unwrap();
    let (out, url) = up(dir.path(), &[]);
    let (base, token) = url.split_once("/#token=").unwrap_or_else(|| panic!("no #token= in {url}"));
    assert!(token.len() >= 32 && token.chars().all(|c| c.is_ascii_hexdigit()), "{token}");
    let addr = base.strip_prefix("http://").expect("http url");
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");

    let (status, body) = http(addr, "GET", "/api/config", &[], "");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""authRequired":true"#), "{body}");
    let (status, body) = http(addr, "POST", "/api/ListRuns", &[JSON], "{}");
    assert_eq!(status, 401, "no token: {body}");
    let bearer = format!("Bearer {token}");
    let (status, body) = http(addr, "POST", "/api/ListRuns", &[JSON, ("Authorization", &bearer)], "{}");
    assert_eq!(status, 200, "the printed token: {body}");
    let (status, _) =
        http(addr, "POST", "/api/ListRuns", &[("Content-Type", "text/plain"), ("Authorization", &bearer)], "{}");
    assert_eq!(status, 415, "text/plain, even with the token");

    let lines = out.stop();
    let with_token: Vec<&String> = lines.iter().filter(|l| l.contains(token)).collect();
    assert_eq!(with_token.len(), 1, "the token shows on the admin page line only: {with_token:?}");
}

#[test]
fn up_with_no_admin_auth_serves_the_page_open_but_same_origin_only() {
    let dir = tempfile::tempdir().unwrap();
    let (out, url) = up(dir.path(), &["--no-admin-auth"]);
    assert!(!url.contains("#token="), "{url}");
    let addr = url.strip_prefix("http://").and_then(|u| u.strip_suffix('/')).expect("http url").to_string();

    let (status, body) = http(&addr, "GET", "/api/config", &[], "");
    assert!(status == 200 && body.contains(r#""authRequired":false"#), "{status} {body}");
    let (status, body) = http(&addr, "POST", "/api/ListRuns", &[JSON], "{}");
    assert_eq!(status, 200, "open: no token needed: {body}");
    let (status, _) = http(&addr, "POST", "/api/ListRuns", &[("Content-Type", "text/plain")], "{}");
    assert_eq!(status, 415, "still JSON only");
    let (status, _) = http(&addr, "POST", "/api/ListRuns", &[JSON, ("Origin", "http://evil.example")], "{}");
    assert_eq!(status, 403, "still same-origin only");

    let lines = out.stop();
    assert!(lines.iter().any(|l| l.contains("--no-admin-auth")), "a warning says the page is open: {lines:?}");
}
