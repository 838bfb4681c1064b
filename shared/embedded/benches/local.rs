//! Benchmark of the embedded backend. Each part runs in a child process of its own, so load time
//! and RSS are measured per model.
//!
//!     cargo bench -p assay-embedded --bench local            # everything
//!     cargo bench -p assay-embedded --bench local -- smollm2 # one part: embed | smollm2 | gemma3 | gemma3-completion
//!
//! Needs the models (`assay models fetch`).

use std::time::{Duration, Instant};

use assay_embedded::judge::run_judge_set;
use assay_embedded::{LocalChat, LocalChatOptions, LocalEmbedder, LocalModelChoice, ModelPaths, PromptStyle};
use assay_llm::{ChatRequest, EmbeddingModel, EmbeddingRequest, Message, ResponseFormat};

const PARTS: [&str; 4] = ["embed", "smollm2", "gemma3", "gemma3-completion"];

fn rss_mb() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .map(|kb| kb / 1024.0)
            .unwrap_or(0.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn sentences(n: usize) -> Vec<String> {
    let base = [
        "The quick brown fox jumps over the lazy dog.",
        "Assay evaluates the outputs of large language models against requirements.",
        "A short one.",
        "The committee will meet again next Tuesday to review the budget proposal and the hiring plan.",
        "Is Paris the capital of France?",
        "Embeddings map sentences to vectors so that similar meanings end up close together.",
        "Rain is expected in the afternoon, with temperatures falling to around ten degrees.",
        "Please summarise the attached report in three bullet points.",
    ];
    (0..n).map(|i| format!("{} ({i})", base[i % base.len()])).collect()
}

async fn bench_embed() {
    let dir = assay_embedded::default_models_dir();
    let t = Instant::now();
    let e = LocalEmbedder::load(&ModelPaths::in_dir(&dir).minilm_dir).expect("load MiniLM");
    let load = t.elapsed();
    let (rss_load, _) = rss_mb();
    let embed = |texts: Vec<String>| {
        let e = e.clone();
        async move { e.embed(EmbeddingRequest { texts, ..Default::default() }).await.unwrap() }
    };
    embed(sentences(8)).await; // warm-up
    let n1 = 64;
    let t = Instant::now();
    for s in sentences(n1) {
        embed(vec![s]).await;
    }
    let b1 = n1 as f64 / t.elapsed().as_secs_f64();
    let n32 = 512;
    let t = Instant::now();
    for chunk in sentences(n32).chunks(32) {
        embed(chunk.to_vec()).await;
    }
    let b32 = n32 as f64 / t.elapsed().as_secs_f64();
    let (rss, hwm) = rss_mb();
    println!(
        "embed  all-MiniLM-L6-v2 ({} candle threads, {} batch parts at once): load {:.2}s, batch1 {:.0} sent/s, batch32 {:.0} sent/s, RSS after load {:.0} MB, RSS {:.0} MB (peak {:.0} MB)",
        candle_core::utils::get_num_threads(),
        e.workers(),
        load.as_secs_f64(),
        b1,
        b32,
        rss_load,
        rss,
        hwm
    );
}

fn answers_schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "answers": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
                "type": "object",
                "properties": {"index": {"type": "integer", "minimum": 0}, "answer": {"type": "string", "enum": ["YES", "NO"]}},
                "required": ["index", "answer"]}},
            "reason": {"type": "string", "maxLength": 200}
        },
        "required": ["answers", "reason"]
    })
}

fn long_prompt(tag: usize) -> String {
    let mut s = format!("Document {tag}.\n");
    for i in 0..12 {
        s.push_str(&format!(
            "Paragraph {i}: the city council discussed the new park, the budget for road repairs, \
             and a proposal to extend library opening hours on weekends. "
        ));
    }
    s.push_str("\nSummarise the document.");
    s
}

async fn bench_chat(choice: LocalModelChoice, style: Option<PromptStyle>) {
    let dir = assay_embedded::default_models_dir();
    let paths = ModelPaths::in_dir(&dir);
    let path = assay_embedded::chat_path(&paths, choice);
    let t = Instant::now();
    let chat = LocalChat::load(&path, choice, LocalChatOptions { prompt_style: style, ..Default::default() })
        .expect("load chat model");
    let load = t.elapsed();
    let (rss_load, _) = rss_mb();
    let style_name = format!(
        "{} prompt, {} threads",
        format!("{:?}", style.unwrap_or(choice.default_prompt_style())).to_lowercase(),
        assay_embedded::chat::default_threads()
    );

    // Prompt throughput: distinct long prompts (no KV reuse beyond the template start).
    let (mut p_tok, mut p_time) = (0u64, Duration::ZERO);
    for tag in 0..3 {
        let r = chat
            .chat_timed(ChatRequest {
                messages: vec![Message::user(long_prompt(tag * 7919))],
                temperature: Some(0.0),
                max_tokens: Some(1),
                ..Default::default()
            })
            .await
            .unwrap();
        p_tok += r.stats.prompt_evaluated;
        p_time += r.stats.prompt_time;
    }
    // Free generation.
    let (mut g_tok, mut g_time) = (0u64, Duration::ZERO);
    for seed in 0..3 {
        let r = chat
            .chat_timed(ChatRequest {
                messages: vec![Message::user("Write a long story about a lighthouse keeper.")],
                temperature: Some(0.7),
                seed: Some(seed),
                max_tokens: Some(128),
                ..Default::default()
            })
            .await
            .unwrap();
        g_tok += r.stats.gen_tokens;
        g_time += r.stats.gen_time;
    }
    // Constrained (JSON schema) generation.
    let (mut c_tok, mut c_time, mut c_ok) = (0u64, Duration::ZERO, 0);
    let runs = 5;
    for seed in 0..runs {
        let r = chat
            .chat_timed(ChatRequest {
                messages: vec![
                    Message::system("You answer numbered yes/no questions."),
                    Message::user(
                        "1. Is the sky blue?\n2. Is fire cold?\nAnswer each with YES or NO and give a short reason.",
                    ),
                ],
                temperature: Some(0.8),
                seed: Some(seed),
                max_tokens: Some(120),
                response_format: ResponseFormat::JsonSchema { name: "answers".into(), schema: answers_schema() },
                ..Default::default()
            })
            .await
            .unwrap();
        c_tok += r.stats.gen_tokens;
        c_time += r.stats.gen_time;
        c_ok += usize::from(r.response.json.is_some());
    }
    let t = Instant::now();
    let judge = run_judge_set(&chat).await.unwrap();
    let judge_time = t.elapsed();
    let (rss, hwm) = rss_mb();
    let tps = |n: u64, d: Duration| n as f64 / d.as_secs_f64().max(1e-9);
    println!(
        "chat   {} ({style_name}): load {:.2}s, prompt {:.0} tok/s, gen {:.1} tok/s, constrained JSON {:.1} tok/s ({c_ok}/{runs} parsed), \
         RSS after load {:.0} MB, RSS {:.0} MB (peak {:.0} MB)",
        choice.model_name(),
        load.as_secs_f64(),
        tps(p_tok, p_time),
        tps(g_tok, g_time),
        tps(c_tok, c_time),
        rss_load,
        rss,
        hwm,
    );
    println!(
        "judge  {} ({style_name}): {}/{} correct ({:.0}%), said YES {} times, AUC of P(yes)-P(no) {:.2}, {:.1}s; wrong: {:?}",
        choice.model_name(),
        judge.correct,
        judge.total,
        judge.accuracy() * 100.0,
        judge.said_yes,
        judge.auc,
        judge_time.as_secs_f64(),
        judge.wrong
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let dir = assay_embedded::default_models_dir();
    if !assay_embedded::models_present(&dir) {
        eprintln!("models missing in {}: run `assay models fetch` first", dir.display());
        std::process::exit(1);
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    match args.first().map(String::as_str) {
        // As the assay binaries run it (`assay_runtime::main`): candle single-threaded, one batch
        // part per core; set RAYON_NUM_THREADS to measure candle's own threading instead.
        Some("embed") if std::env::var_os("RAYON_NUM_THREADS").is_none() => {
            let exe = std::env::current_exe().unwrap();
            let status = std::process::Command::new(&exe)
                .arg("embed")
                .env("RAYON_NUM_THREADS", "1")
                .env("CANDLE_NUM_THREADS", "1")
                .status()
                .unwrap();
            std::process::exit(status.code().unwrap_or(1));
        }
        Some("embed") => rt.block_on(bench_embed()),
        Some("smollm2") => rt.block_on(bench_chat(LocalModelChoice::Smollm2, None)),
        Some("gemma3") => rt.block_on(bench_chat(LocalModelChoice::Gemma3, Some(PromptStyle::Chat))),
        Some("gemma3-completion") => rt.block_on(bench_chat(LocalModelChoice::Gemma3, Some(PromptStyle::Completion))),
        Some("smollm2-completion") => rt.block_on(bench_chat(LocalModelChoice::Smollm2, Some(PromptStyle::Completion))),
        Some(other) => {
            eprintln!("unknown part {other}; parts: {PARTS:?}");
            std::process::exit(2);
        }
        None => {
            let exe = std::env::current_exe().unwrap();
            for part in PARTS {
                let mut cmd = std::process::Command::new(&exe);
                if part == "embed" && std::env::var_os("RAYON_NUM_THREADS").is_none() {
                    cmd.env("RAYON_NUM_THREADS", "1").env("CANDLE_NUM_THREADS", "1");
                }
                let status = cmd.arg(part).status().unwrap();
                if !status.success() {
                    eprintln!("part {part} failed: {status}");
                }
            }
        }
    }
}
