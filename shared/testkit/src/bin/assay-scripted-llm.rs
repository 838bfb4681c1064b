//! `assay-scripted-llm`: the deterministic OpenAI-compatible test server as a process, answering
//! every chat call with an instance of the requested JSON schema (see `schema_fake`) after a fixed
//! latency. Used by benchmarks that compare Assay with other clients against the same backend.
//!
//! Usage: `assay-scripted-llm [--latency-ms N] [--capacity N] [--faults R,E,U] [--seed N]
//! [--arrivals FILE]`.
//! `--capacity`: requests served at once at most, the rest answered 429 at once (a server with N
//! slots; default unlimited). `--faults`: shares of attempts answered 429 (R), 5xx (E) and never
//! answered (U), e.g. `0.2,0.1,0.05`, drawn from `--seed` (default 1). `--arrivals`: the Unix time
//! (seconds) each request arrived, one per line (the benchmarks' breakdown reads when a run's
//! first call reached the backend and when its last reply left). Prints the base URL on the
//! first line of standard output, then serves on 127.0.0.1 until SIGINT/SIGTERM; on exit prints the
//! number of requests served, the peak in flight, the requests refused for capacity and the faults
//! injected to standard error.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use assay_testkit::{FaultCounts, FaultMix};

const USAGE: &str =
    "usage: assay-scripted-llm [--latency-ms N] [--capacity N] [--faults R,E,U] [--seed N] [--arrivals FILE]";

/// `R,E,U`: three shares in [0, 1] whose sum is at most 1.
fn fault_mix(value: &str) -> Option<FaultMix> {
    let shares: Vec<f64> = value.split(',').map(|s| s.trim().parse().ok()).collect::<Option<_>>()?;
    let [rate_limited, server_error, unanswered] = shares[..] else { return None };
    let valid = shares.iter().all(|s| (0.0..=1.0).contains(s)) && shares.iter().sum::<f64>() <= 1.0;
    valid.then_some(FaultMix { rate_limited, server_error, unanswered })
}

/// An option's value read with `parse`; a missing or bad one exits 2 with `why`.
fn parsed<T, E>(value: Option<String>, parse: impl Fn(&str) -> Result<T, E>, why: &str) -> T {
    value.as_deref().and_then(|v| parse(v).ok()).unwrap_or_else(|| {
        eprintln!("{why}; {USAGE}");
        std::process::exit(2)
    })
}

#[tokio::main]
async fn main() {
    let mut latency_ms = 50u64;
    let mut capacity = 0usize;
    let mut faults = None;
    let mut seed = 1u64;
    let mut arrivals: Option<std::path::PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let value = args.next();
        match a.as_str() {
            "--latency-ms" => {
                latency_ms = parsed(value, str::parse, "--latency-ms needs a whole number of milliseconds")
            }
            "--capacity" => capacity = parsed(value, str::parse, "--capacity needs a whole number of requests"),
            "--faults" => {
                let why = "--faults needs three shares R,E,U in [0, 1] summing to at most 1, e.g. 0.2,0.1,0.05";
                faults = Some(parsed(value, |v| fault_mix(v).ok_or(()), why));
            }
            "--seed" => seed = parsed(value, str::parse, "--seed needs a whole number"),
            "--arrivals" => arrivals = Some(parsed(value, str::parse, "--arrivals needs a file")),
            other => {
                eprintln!("unknown argument {other:?}; {USAGE}");
                std::process::exit(2)
            }
        }
    }
    let server = assay_testkit::ScriptedLlm::start().await;
    // Millions of calls in a long benchmark: counted, not kept.
    server.stop_recording();
    let schema = assay_testkit::schema_handler(Duration::from_millis(latency_ms));
    let log = arrivals.map(|path| {
        let file = std::fs::File::create(&path).unwrap_or_else(|e| {
            eprintln!("--arrivals {}: {e}", path.display());
            std::process::exit(2)
        });
        Arc::new(std::sync::Mutex::new(std::io::BufWriter::new(file)))
    });
    let arrived = log.clone();
    let answers = move |r: &assay_testkit::RecordedRequest| {
        if let Some(log) = &arrived {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            let mut w = log.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let _ = writeln!(w, "{:.6}", now.as_secs_f64());
        }
        schema(r)
    };
    let counts = Arc::new(FaultCounts::default());
    match faults {
        Some(mix) => server.set_handler(assay_testkit::with_faults(answers, mix, seed, counts.clone())),
        None => server.set_handler(answers),
    }
    server.set_capacity(capacity);
    println!("{}", server.base_url());
    let _ = std::io::stdout().flush();
    assay_rpc::shutdown_signal().await;
    if let Some(log) = &log {
        let _ = log.lock().unwrap_or_else(std::sync::PoisonError::into_inner).flush();
    }
    eprintln!(
        "assay-scripted-llm: served {} requests, at most {} at once, {} refused for capacity; faults: {} x 429, {} x 5xx, {} unanswered",
        server.request_count(),
        server.peak_in_flight(),
        server.over_capacity_count(),
        counts.rate_limited.load(Ordering::Relaxed),
        counts.server_error.load(Ordering::Relaxed),
        counts.unanswered.load(Ordering::Relaxed),
    );
}
