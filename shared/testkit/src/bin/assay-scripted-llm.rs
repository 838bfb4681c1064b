//! `assay-scripted-llm`: the deterministic OpenAI-compatible test server as a process, answering
//! every chat call with an instance of the requested JSON schema (see `schema_fake`) after a fixed
//! latency. Used by benchmarks that compare Assay with other clients against the same backend.
//!
//! Usage: `assay-scripted-llm [--latency-ms N] [--capacity N]`. `--capacity`: requests served at
//! once at most, the rest answered 429 at once (a server with N slots; default unlimited). Prints
//! the base URL on the first line of standard output, then serves on 127.0.0.1 until
//! SIGINT/SIGTERM; on exit prints the number of requests served, the peak in flight and the
//! requests refused for capacity to standard error.

use std::io::Write;
use std::time::Duration;

#[tokio::main]
async fn main() {
    let mut latency_ms = 50u64;
    let mut capacity = 0usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--latency-ms" => {
                latency_ms = args.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
                    eprintln!("--latency-ms needs a whole number of milliseconds");
                    std::process::exit(2)
                })
            }
            "--capacity" => {
                capacity = args.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
                    eprintln!("--capacity needs a whole number of requests");
                    std::process::exit(2)
                })
            }
            other => {
                eprintln!("unknown argument {other:?}; usage: assay-scripted-llm [--latency-ms N] [--capacity N]");
                std::process::exit(2)
            }
        }
    }
    let server = assay_testkit::ScriptedLlm::start().await;
    server.set_handler(assay_testkit::schema_handler(Duration::from_millis(latency_ms)));
    server.set_capacity(capacity);
    println!("{}", server.base_url());
    let _ = std::io::stdout().flush();
    assay_rpc::shutdown_signal().await;
    eprintln!(
        "assay-scripted-llm: served {} requests, at most {} at once, {} refused for capacity",
        server.request_count(),
        server.peak_in_flight(),
        server.over_capacity_count()
    );
}
