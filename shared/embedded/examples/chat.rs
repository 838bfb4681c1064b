//! Ask a local model one question and print the reply, its first-token alternatives and timings.
//!
//!     cargo run -p assay-embedded --example chat -- [--model smollm2|gemma3] [--gguf FILE] [--completion]
//!         [--choice YES,NO] [--json SCHEMA] [--temperature T] [--seed N] [--max-tokens N] "question"

use assay_embedded::{LocalChat, LocalChatOptions, LocalModelChoice, ModelPaths, PromptStyle};
use assay_llm::{ChatModel, ChatRequest, Message, ResponseFormat};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let mut choice = LocalModelChoice::default();
    let mut style = None;
    let mut threads = None;
    let mut req = ChatRequest { temperature: Some(0.0), top_logprobs: Some(5), ..Default::default() };
    let mut system = None;
    let mut question = String::new();
    let mut judge = false;
    let mut gguf: Option<std::path::PathBuf> = None;
    while let Some(a) = args.next() {
        let mut val = || args.next().expect("missing value");
        match a.as_str() {
            "--model" => choice = val().parse().expect("model"),
            "--completion" => style = Some(PromptStyle::Completion),
            "--judge" => judge = true,
            // Another GGUF file with the chosen model's chat template (smollm2: ChatML).
            "--gguf" => gguf = Some(val().into()),
            "--threads" => threads = Some(val().parse().expect("threads")),
            "--system" => system = Some(val()),
            "--choice" => req.response_format = ResponseFormat::Choice(val().split(',').map(String::from).collect()),
            "--json" => {
                req.response_format = ResponseFormat::JsonSchema {
                    name: "schema".into(),
                    schema: serde_json::from_str(&val()).expect("schema"),
                }
            }
            "--temperature" => req.temperature = Some(val().parse().expect("temperature")),
            "--seed" => req.seed = Some(val().parse().expect("seed")),
            "--max-tokens" => req.max_tokens = Some(val().parse().expect("max tokens")),
            _ => question = a,
        }
    }
    if let Some(s) = system {
        req.messages.push(Message::system(s));
    }
    req.messages.push(Message::user(question));
    let paths = ModelPaths::in_dir(&assay_embedded::default_models_dir());
    let chat = LocalChat::load(
        &gguf.unwrap_or_else(|| assay_embedded::chat_path(&paths, choice)),
        choice,
        LocalChatOptions { prompt_style: style, threads, ..Default::default() },
    )
    .expect("load");
    if judge {
        // The labeled YES/NO set, one line per question with P(YES) and P(NO) of the first token.
        let mut correct = 0;
        for (q, yes) in assay_embedded::judge::JUDGE_SET {
            let mut jr = assay_embedded::judge::judge_request(q);
            if let Some(sys) = req.messages.iter().find(|m| m.role == assay_llm::Role::System) {
                jr.messages[0] = sys.clone();
            }
            let r = chat.chat(jr).await.expect("chat");
            let lp = r.first_token_logprobs.unwrap_or_default();
            let p = |s: &str| {
                lp.iter()
                    .filter(|l| s.to_lowercase().starts_with(&l.token.to_lowercase()))
                    .map(|l| l.logprob.exp())
                    .sum::<f64>()
            };
            let ok = (r.text == "YES") == *yes;
            correct += usize::from(ok);
            println!(
                "{} want {:3} got {:3} p(Y)={:.3} p(N)={:.3}  {}",
                if ok { "ok " } else { "BAD" },
                if *yes { "YES" } else { "NO" },
                r.text,
                p("YES"),
                p("NO"),
                q.lines().next().unwrap_or(q)
            );
        }
        println!("{correct}/{}", assay_embedded::judge::JUDGE_SET.len());
        let report = assay_embedded::judge::run_judge_set(&chat).await.expect("judge");
        println!(
            "run_judge_set: {}/{} said_yes {} auc {:.3}",
            report.correct, report.total, report.said_yes, report.auc
        );
        return;
    }
    let r = chat.chat_timed(req).await.expect("chat");
    println!("{}", r.response.text);
    eprintln!("json: {:?}", r.response.json);
    eprintln!("first token: {:?}", r.response.first_token_logprobs);
    eprintln!("finish: {:?}, usage: {:?}", r.response.finish_reason, r.response.usage);
    eprintln!("stats: {:?}", r.stats);
}
