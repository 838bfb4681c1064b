//! `ASSAY_TIMINGS=FILE`: when a verb reached each step of its run (`main`, `runtime`: its async
//! runtime started, `admitted`: the gateway
//! created the run, `first_event`, `ended`: the run's last event, `exit`), appended to FILE as one
//! JSON line of Unix times in seconds. `bench/breakdown.py` reads it beside the backend's arrival
//! times to say where a run's time above its critical path goes.

use std::io::Write;
use std::sync::{Mutex, OnceLock, PoisonError};

static MARKS: Mutex<Vec<(&str, f64)>> = Mutex::new(Vec::new());

fn file() -> Option<&'static std::path::PathBuf> {
    static FILE: OnceLock<Option<std::path::PathBuf>> = OnceLock::new();
    FILE.get_or_init(|| std::env::var_os("ASSAY_TIMINGS").map(Into::into)).as_ref()
}

/// The verb reached `step` (its first time only), when `ASSAY_TIMINGS` is set.
pub fn mark(step: &'static str) {
    if file().is_some() {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        mark_at(step, now.as_secs_f64());
    }
}

/// `step` happened at Unix time `at` (seconds; its first time only), when `ASSAY_TIMINGS` is set:
/// a moment another process reported (a run event's time).
pub fn mark_at(step: &'static str, at: f64) {
    if file().is_none() {
        return;
    }
    let mut marks = MARKS.lock().unwrap_or_else(PoisonError::into_inner);
    if !marks.iter().any(|(s, _)| *s == step) {
        marks.push((step, at));
    }
}

/// Append the steps reached (with `exit` now) to the `ASSAY_TIMINGS` file, if set.
pub fn write() {
    let Some(path) = file() else { return };
    mark("exit");
    let marks = MARKS.lock().unwrap_or_else(PoisonError::into_inner);
    let line: serde_json::Map<String, serde_json::Value> =
        marks.iter().map(|(s, t)| ((*s).to_string(), (*t).into())).collect();
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| writeln!(f, "{}", serde_json::Value::Object(line)));
    if let Err(e) = written {
        eprintln!("ASSAY_TIMINGS {}: {e}", path.display());
    }
}
