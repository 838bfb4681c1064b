//! Benchmark of the checklist refiners with the embedded MiniLM embedder:
//! Selector on 500 candidate questions (max 20, beam 5) and Deduplicator on 1000 questions.
//! Merge calls of the Deduplicator go to a scripted OpenAI-compatible server answering at once
//! (0 ms), so the figures are the refiners' own cost plus embedding.
//!
//!     cargo bench -p assay-refiners --bench refiners
//!
//! Needs the models (`assay models fetch`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use assay_domain::{ChecklistItem, ModelSpec};
use assay_embedded::{LocalEmbedder, ModelPaths};
use assay_llm::ModelHub;
use assay_llm::{Backends, EmbeddingModel, EmbeddingRequest, OpenAiClient, OpenAiConfig, PhaseModels};
use assay_refiners::ChecklistRefiners;
use assay_refiners::core::{BeamConfig, DedupOptions, SelectOptions, beam_search, cluster, cosine_matrix};
use assay_testkit::{Reply, ScriptedLlm};
use serde_json::json;

fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

const ASPECTS: [&str; 40] = [
    "cite at least one source for its factual claims",
    "stay under 200 words",
    "answer the question asked in the first sentence",
    "use a polite and respectful tone",
    "avoid technical jargon",
    "include a concrete example",
    "give step-by-step instructions",
    "mention the main risks involved",
    "end with a short summary",
    "use correct grammar and spelling",
    "avoid repeating the same point",
    "address the user by the name they gave",
    "state any assumptions it makes",
    "provide working code",
    "explain why the recommended option is better",
    "include the requested table",
    "format dates as day month year",
    "avoid giving medical diagnoses",
    "recommend consulting a professional when appropriate",
    "keep each paragraph under five sentences",
    "use bullet points for lists of three or more items",
    "mention the price in euros",
    "stay consistent with the reference answer",
    "avoid making up statistics",
    "acknowledge uncertainty where the evidence is weak",
    "translate every quoted phrase into English",
    "respect the requested word count",
    "use the second person throughout",
    "include a call to action",
    "name the author of the quoted work",
    "avoid offensive language",
    "explain acronyms on first use",
    "give both advantages and disadvantages",
    "follow the requested output format",
    "use metric units",
    "keep the original meaning of the text",
    "answer in the same language as the question",
    "include a title",
    "avoid personal opinions",
    "mention the deadline",
];

const TEMPLATES: [&str; 5] = [
    "Does the response {a}{t}?",
    "Does the answer {a}{t}?",
    "Is it true that the reply manages to {a}{t}?",
    "Would a reader agree that the text does {a}{t}?",
    "Check: does the output {a}{t}?",
];

const TOPICS: [&str; 5] =
    ["", " when discussing travel", " for a cooking question", " in a legal context", " about software"];

/// Templated questions: aspect x topic x phrasing, so near-duplicate clusters exist.
fn questions(n: usize) -> Vec<ChecklistItem> {
    let mut out = Vec::with_capacity(n);
    'outer: for t in TOPICS {
        for a in ASPECTS {
            for tpl in TEMPLATES {
                if out.len() == n {
                    break 'outer;
                }
                let q = tpl.replace("{a}", a).replace("{t}", t);
                out.push(ChecklistItem::new(format!("q{}", out.len() + 1), q));
            }
        }
    }
    out
}

#[tokio::main]
async fn main() {
    let dir = assay_embedded::default_models_dir();
    let t = Instant::now();
    let embedder = Arc::new(
        LocalEmbedder::load(&ModelPaths::in_dir(&dir).minilm_dir).expect("load MiniLM (run `assay models fetch`)"),
    );
    println!("all-MiniLM-L6-v2 loaded in {}", ms(t.elapsed()));

    let llm = ScriptedLlm::start().await;
    llm.set_handler(|_| Reply::json(json!({"question": "Does the response meet the merged criterion?"})));
    let client = Arc::new(OpenAiClient::new(OpenAiConfig::new(llm.base_url())).unwrap());
    let backends = Backends::new().with_chat("scripted", client).with_embedding("local", embedder.clone());
    let mut phases = PhaseModels::default();
    phases.default.backend = "local".into();
    let core = ChecklistRefiners::new(Arc::new(ModelHub::new(backends, phases)));
    let local = ModelSpec { backend: Some("local".into()), ..Default::default() };
    let scripted = ModelSpec { backend: Some("scripted".into()), ..Default::default() };

    let embed = |items: &[ChecklistItem]| {
        let texts = items.iter().map(|i| i.question.clone()).collect();
        let e = embedder.clone();
        async move { e.embed(EmbeddingRequest { texts, ..Default::default() }).await.unwrap().vectors }
    };
    embed(&questions(8)).await; // warm-up

    // ---- Selector: 500 candidates, max 20, beam 5 ----
    let all = questions(1000);
    let candidates: Vec<ChecklistItem> = all.iter().step_by(2).cloned().collect();
    let t = Instant::now();
    let vectors = embed(&candidates).await;
    let t_embed = t.elapsed();
    let t = Instant::now();
    let sim = cosine_matrix(&vectors);
    let t_matrix = t.elapsed();
    let t = Instant::now();
    let result = beam_search(&sim, None, &BeamConfig::default());
    let t_beam = t.elapsed();
    let t = Instant::now();
    let out = core
        .select(
            candidates.clone(),
            &SelectOptions {
                max_questions: Some(20),
                beam_width: Some(5),
                embedding_model: local.clone(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let t_total = t.elapsed();
    assert_eq!(out.items.len(), 20);
    assert!((out.diversity - result.diversity).abs() < 1e-9);
    println!(
        "selector  500 candidates -> {} (max 20, beam 5): embedding {}, cosine matrix {}, beam search {}, total select call {} (embedding included); diversity {:.4}, score {:.4}; peak RSS {:.0} MB",
        out.items.len(),
        ms(t_embed),
        ms(t_matrix),
        ms(t_beam),
        ms(t_total),
        out.diversity,
        out.score,
        peak_rss_mb()
    );

    // ---- Deduplicator: 1000 questions, threshold 0.85 ----
    let t = Instant::now();
    let vectors = embed(&all).await;
    let t_embed = t.elapsed();
    let t = Instant::now();
    let clustering = cluster(&vectors, 0.85);
    let t_cluster = t.elapsed();
    let multi = clustering.clusters.iter().filter(|c| c.len() > 1).count();
    let t = Instant::now();
    let out = core
        .deduplicate(all.clone(), &DedupOptions { threshold: None, model: scripted, embedding_model: local })
        .await
        .unwrap();
    let t_total = t.elapsed();
    assert_eq!(out.clusters_merged as usize, multi);
    println!(
        "dedup     1000 questions -> {} ({} clusters merged, largest {}): embedding {}, clustering {}, total deduplicate call {} (embedding + {} merge calls to a scripted 0 ms server); peak RSS {:.0} MB",
        out.items.len(),
        out.clusters_merged,
        clustering.clusters.iter().map(Vec::len).max().unwrap_or(0),
        ms(t_embed),
        ms(t_cluster),
        ms(t_total),
        llm.request_count(),
        peak_rss_mb()
    );
}
