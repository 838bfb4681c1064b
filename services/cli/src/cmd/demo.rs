//! `assay demo`: start the mesh, evaluate two example records, print the result, stop.

use std::path::Path;

use assay_config::AssayConfig;
use assay_proto::common::v1 as common;
use assay_proto::gateway::v1 as gw;

use super::common::{BackendArgs, load_config};
use super::error::{CliError, Ending, Outcome, status_text};
use super::session::start;

/// Options of `assay demo`.
#[derive(clap::Args, Clone)]
pub struct DemoArgs {
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Use ephemeral ports instead of the configured ones.
    #[arg(long)]
    pub ephemeral_ports: bool,
}

/// `assay demo` with the configuration at `config` (`--config`): 0 done, 1 it failed.
pub async fn run(config: Option<&Path>, args: DemoArgs) -> Outcome {
    let config = load_config(config, &args.backend)?;
    demo(config, args.ephemeral_ports).await?;
    Ok(Ending::Done)
}

fn example_request() -> gw::EvaluateRequest {
    let checklist = common::Checklist {
        id: "demo-haiku".into(),
        input: "Write a haiku about autumn leaves.".into(),
        items: [
            "Is the response a poem of exactly three lines?",
            "Is the response about autumn leaves?",
            "Does the response avoid rhyming couplets?",
        ]
        .iter()
        .enumerate()
        .map(|(i, q)| common::ChecklistItem { id: format!("q{}", i + 1), question: (*q).into(), ..Default::default() })
        .collect(),
        ..Default::default()
    };
    let records = [
        "Crimson leaves drifting\nwhisper on the cooling wind\nautumn lets them go",
        "Leaves are falling down, the town is brown, I wear a frown, and leave the town.",
    ]
    .iter()
    .enumerate()
    .map(|(i, t)| gw::EvalRecord { id: format!("r{}", i + 1), target: (*t).into(), ..Default::default() })
    .collect();
    gw::EvaluateRequest {
        pipeline: Some(gw::ChecklistEvalPipeline {
            source: Some(gw::ChecklistSource { source: Some(gw::checklist_source::Source::Checklist(checklist)) }),
            records,
            ..Default::default()
        }),
        budget: None,
    }
}

/// The kind of the configured backend `name` (`local`, `openai`), or the name itself.
fn backend_kind<'a>(config: &'a AssayConfig, name: &'a str) -> &'a str {
    config.backends.get(name).map_or(name, |b| b.kind.as_str())
}

/// `model: smollm2-135m-instruct (embedded, backend local), temperature 0.0, for the scorer`.
fn model_line(config: &AssayConfig, m: &common::ModelRecord) -> String {
    let kind = backend_kind(config, &m.backend);
    let place = if kind == "local" {
        format!("embedded, backend {}", m.backend)
    } else {
        format!("backend {} ({kind})", m.backend)
    };
    let temperature = m
        .temperature
        .map_or_else(|| "the backend's default temperature".to_string(), |t| format!("temperature {t:.1}"));
    format!("model: {} ({place}), {temperature}, for the {}", m.model, m.phase.replace('_', " "))
}

/// The commands the demo suggests next (arguments of `assay`), and what each does.
pub const DEMO_NEXT: [(&str, &str); 3] = [
    ("refine --doc examples/lesson.json", "improve a document where judges find issues (minutes here)"),
    ("debate --data examples/problems-short.jsonl", "three solvers and a judge on 3 problems (50: problems.jsonl)"),
    ("up", "the mesh and its admin page (URL printed)"),
];

/// What the demo's reader should know and try next, each command as this binary was run
/// (`./target/release/assay` from a checkout, `assay` from a wheel on PATH).
fn demo_next_steps(embedded: bool) -> Vec<String> {
    let me = std::env::args().next().filter(|a| !a.is_empty()).unwrap_or_else(|| "assay".into());
    let mut lines = Vec::new();
    if embedded {
        lines.push(
            "This ran on the embedded model, a 135M-parameter model that runs offline: it shows the pipeline \
             working, not a judge to trust (it is at chance on the bench's judge set, 15/30)."
                .to_string(),
        );
        lines.push("The same demo against any OpenAI-compatible server (OpenAI, vLLM, Ollama, LiteLLM):".to_string());
        lines.push(format!(
            "  OPENAI_BASE_URL=http://127.0.0.1:11434/v1 OPENAI_API_KEY=... {me} demo --backend openai --model MODEL"
        ));
    }
    lines.push("Next:".to_string());
    for (args, what) in DEMO_NEXT {
        lines.push(format!("  {me} {args:<46} {what}"));
    }
    lines
}

async fn demo(mut config: AssayConfig, ephemeral: bool) -> Result<(), CliError> {
    if ephemeral {
        config.ports = assay_config::Ports::ephemeral();
    }
    let mesh = start(&config).await?;
    let url = format!("http://{}", mesh.addrs.gateway);
    let result = async {
        let channel = assay_runtime::channel(&config, &url)?;
        let token = assay_runtime::auth_token(&config);
        let mut client = gw::gateway_service_client::GatewayServiceClient::with_interceptor(
            channel,
            assay_rpc::auth::BearerInterceptor::new(token.as_deref()),
        );
        let started = std::time::Instant::now();
        let reply = client
            .evaluate(example_request())
            .await
            .map_err(|s| CliError::Failed(format!("evaluate failed: {}", status_text(&s))))?;
        let r = reply.into_inner();
        outln!("evaluation {} through {url} in {:.2?}", r.run_id, started.elapsed());
        for rec in &r.results {
            let s = rec.score.clone().unwrap_or_default();
            outln!(
                "record {}: pass_rate {:.2} ({} answered, {} unanswered)",
                rec.record_id,
                s.pass_rate,
                s.answered_count,
                s.unanswered_count
            );
            for it in &s.item_scores {
                let answer = common::Answer::try_from(it.answer).map(|a| a.as_str_name()).unwrap_or("?");
                outln!("  {} {}", it.item_id, answer.trim_start_matches("ANSWER_").to_lowercase());
            }
        }
        if let Some(a) = &r.aggregate {
            outln!(
                "aggregate: mean primary {:.3}, macro pass {:.3}, micro pass {:.3}",
                a.mean_primary_score,
                a.macro_pass_rate,
                a.micro_pass_rate
            );
        }
        if let Some(u) = &r.usage {
            outln!(
                "usage: {} calls, {} prompt + {} completion tokens, {}, {} cache hits",
                u.calls,
                u.prompt_tokens,
                u.completion_tokens,
                super::render::cost_text(u),
                u.cache_hits
            );
        }
        for m in &r.models {
            outln!("{}", model_line(&config, m));
        }
        let embedded = r.models.iter().any(|m| backend_kind(&config, &m.backend) == "local");
        outln!();
        for line in demo_next_steps(embedded) {
            outln!("{line}");
        }
        Ok::<(), CliError>(())
    }
    .await;
    mesh.shutdown().await.map_err(|e| CliError::Failed(e.to_string()))?;
    result
}
