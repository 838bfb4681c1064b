//! Helpers shared by the `assay` binary's end-to-end tests: a config file pointing at a scripted
//! backend, running the binary (with or without that config, on or off the test's runtime), its
//! stderr, an `--out` file's lines and a small deterministic generator.
// Each test binary uses its own subset.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use assay_testkit::ScriptedLlm;
use serde_json::Value;

/// `assay.toml` in `dir`: every model on `backend`, the run store at `store` (`:memory:` for
/// none), the response cache off.
pub fn config_file(dir: &Path, backend: &ScriptedLlm, store: &str) -> PathBuf {
    let path = dir.join("assay.toml");
    let toml = format!(
        "[backends.openai]\nbase_url = \"{}\"\nmodel = \"scripted\"\n\n[models.default]\nbackend = \"openai\"\n\n\
         [gateway]\nstore = \"{store}\"\n\n[cache]\nenabled = false\n",
        backend.base_url()
    );
    std::fs::write(&path, toml).unwrap();
    path
}

/// Rust debug formatting that must never reach a user: an `Option`'s or a `Result`'s debug form,
/// and the debug names of gRPC codes.
const DEBUG_FORMS: [&str; 14] = [
    "Some(",
    "None,",
    "None)",
    " None\n",
    "Ok(",
    "Err(",
    "InvalidArgument",
    "FailedPrecondition",
    "NotFound",
    "DeadlineExceeded",
    "ResourceExhausted",
    "PermissionDenied",
    "AlreadyExists",
    "Unauthenticated:",
];

/// Fails when the command's stdout or stderr carries Rust debug formatting, or (the binary runs
/// without `RUST_LOG`) info log lines, which belong to `-v`. Every run of the binary in these tests
/// goes through it, so every verb's human and `--json` output is checked.
pub fn assert_plain(o: &Output) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains(" INFO "), "info log lines without -v:\n{err}");
    for (stream, bytes) in [("stdout", &o.stdout), ("stderr", &o.stderr)] {
        let text = String::from_utf8_lossy(bytes);
        for form in DEBUG_FORMS {
            assert!(!text.contains(form), "debug formatting {form:?} in the {stream} of assay:\n{text}");
        }
    }
}

/// The binary with `args` and no config (commands that read files only).
pub fn assay(args: &[&str]) -> Output {
    let o = Command::new(env!("CARGO_BIN_EXE_assay")).args(args).env_remove("RUST_LOG").output().expect("assay runs");
    assert_plain(&o);
    o
}

/// The binary with `args` and no config, as in a terminal `columns` wide (`COLUMNS`; the output is
/// no terminal): what `--help` wraps to.
pub fn assay_at_width(columns: usize, args: &[&str]) -> Output {
    let o = Command::new(env!("CARGO_BIN_EXE_assay"))
        .args(args)
        .env("COLUMNS", columns.to_string())
        .env_remove("RUST_LOG")
        .output()
        .expect("assay runs");
    assert_plain(&o);
    o
}

/// The binary with `--config config` and `args`, the backend's key set and no `OPENAI_BASE_URL`
/// from the environment.
pub fn assay_with(config: &Path, args: &[&str]) -> Output {
    let o = Command::new(env!("CARGO_BIN_EXE_assay"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env("OPENAI_API_KEY", "test")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("RUST_LOG")
        .output()
        .expect("assay runs");
    assert_plain(&o);
    o
}

/// [`assay_with`] off the test's runtime (the scripted backend, and a mesh the test started,
/// live on it).
pub async fn assay_async(config: &Path, args: &[&str]) -> Output {
    let config = config.to_path_buf();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assay_with(&config, &args)
    })
    .await
    .unwrap()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The JSON lines of a file.
pub fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// A small deterministic generator (no randomness crate needed): uniform in [0, 1).
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}
