//! Benchmark of self-refine's convergence measures.
//!
//! 1. Character similarity (exact Levenshtein over chars) on 20 KB drafts: an early insertion,
//!    scattered word edits, a rewrite of the whole text; and Jaccard on the same pairs.
//! 2. Whether the cascade's embedding step pays on the embedded backend (all-MiniLM-L6-v2 in
//!    process): labelled revision pairs built from the lesson fixtures' sections (cosmetic
//!    revisions, which should converge: reworded, reordered, reformatted; substantive ones, which
//!    should not: an added example, a removed step, a corrected fact, an expansion). For every pair
//!    the text steps run; for those they leave undecided, the decision without the embedding step
//!    (permissive: Jaccard >= 0.95) is set against the decision with it (cosine >= 0.92), both
//!    against the label, with the milliseconds the embedding call costs.
//!
//!     cargo bench -p assay-refiners --bench self_refine_similarity
//!
//! Part 2 needs the models (`assay models fetch`); without them it says so and stops.

use std::time::{Duration, Instant};

use assay_domain::similarity::{
    EMBEDDING_CONVERGED, JACCARD_CONVERGED, TextSteps, char_similarity, jaccard, text_steps,
};
use assay_embedded::{LocalEmbedder, ModelPaths};
use assay_llm::{EmbeddingModel, EmbeddingRequest};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Median wall time of `runs` calls of `f`.
fn median_ms(runs: usize, mut f: impl FnMut()) -> f64 {
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            ms(t.elapsed())
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// The sections of the lesson fixtures (the drafts of part 2, and the prose of part 1).
fn sections() -> Vec<String> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let mut out = Vec::new();
    for file in ["examples/lesson.json", "tests/fixtures/lesson12.json", "tests/fixtures/lesson_compound_interest.json"]
    {
        let text = std::fs::read_to_string(format!("{root}/{file}")).unwrap_or_else(|e| panic!("{file}: {e}"));
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
        for s in doc["sections"].as_array().into_iter().flatten() {
            if let Some(c) = s["content"].as_str() {
                out.push(c.to_string());
            }
        }
    }
    out
}

/// Sentences of a text (split after `. `, `? `, `! ` and at line breaks), each with its ending.
fn sentences(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let chars: Vec<char> = text.chars().collect();
    for (i, c) in chars.iter().enumerate() {
        cur.push(*c);
        let end = matches!(c, '.' | '?' | '!') && chars.get(i + 1).is_none_or(|n| n.is_whitespace()) || *c == '\n';
        if end && !cur.trim().is_empty() {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur);
    }
    out
}

/// Word-for-word synonyms a copy editor uses (both cases by the first letter).
const SYNONYMS: &[(&str, &str)] = &[
    ("use", "employ"),
    ("uses", "employs"),
    ("show", "demonstrate"),
    ("shows", "demonstrates"),
    ("make", "create"),
    ("makes", "creates"),
    ("help", "assist"),
    ("helps", "assists"),
    ("get", "obtain"),
    ("large", "big"),
    ("small", "little"),
    ("start", "begin"),
    ("each", "every"),
    ("because", "since"),
    ("important", "essential"),
    ("explain", "describe"),
    ("learn", "discover"),
    ("often", "frequently"),
    ("also", "additionally"),
    ("example", "instance"),
    ("simple", "basic"),
    ("find", "identify"),
    ("need", "require"),
    ("needs", "requires"),
    ("give", "provide"),
    ("gives", "provides"),
    ("many", "numerous"),
    ("people", "individuals"),
    ("customers", "clients"),
    ("customer", "client"),
    ("team", "group"),
    ("teams", "groups"),
    ("buy", "purchase"),
    ("grows", "increases"),
    ("earns", "receives"),
    ("quickly", "rapidly"),
    ("whole", "entire"),
    ("next", "following"),
    ("every", "each"),
    ("problem", "issue"),
    ("plan", "prepare"),
    ("build", "construct"),
    ("thing", "item"),
];

fn reword(text: &str) -> String {
    let mut out = String::new();
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        let lower = word.to_lowercase();
        match SYNONYMS.iter().find(|(a, _)| *a == lower) {
            Some((_, b)) if word.starts_with(char::is_uppercase) => {
                let mut c = b.chars();
                out.extend(c.next().into_iter().flat_map(char::to_uppercase).chain(c));
            }
            Some((_, b)) => out.push_str(b),
            None => out.push_str(word),
        }
        word.clear();
    };
    for c in text.chars() {
        if c.is_alphanumeric() {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

/// Swap the first two sentences and the last two.
fn reorder(text: &str) -> String {
    let mut s = sentences(text);
    let n = s.len();
    if n >= 4 {
        s.swap(0, 1);
        s.swap(n - 2, n - 1);
    } else if n >= 2 {
        s.swap(0, n - 1);
    }
    s.concat()
}

/// Contractions, dashes for commas, a bold lead: the wording stays.
fn reformat(text: &str) -> String {
    let t = text
        .replace("do not", "don't")
        .replace("does not", "doesn't")
        .replace("is not", "isn't")
        .replace("you will", "you'll")
        .replace(", which", " - which")
        .replace(", and", " and");
    format!("**Note.** {t}")
}

/// A concrete example appended.
fn add_example(text: &str) -> String {
    format!(
        "{}\n\nFor example, a bakery that sells 40 loaves a day tried the idea for two weeks: it wrote down every \
         order, compared the numbers with the month before, and kept only the change that brought more repeat \
         buyers on weekday mornings.",
        text.trim_end()
    )
}

/// The middle sentence (a step) removed.
fn remove_step(text: &str) -> String {
    let mut s = sentences(text);
    if s.len() >= 3 {
        s.remove(s.len() / 2);
    }
    s.concat()
}

/// A fact corrected: the digits changed, and the first claim turned round.
fn correct_fact(text: &str) -> String {
    let digits: String = text
        .chars()
        .map(|c| match c {
            '1' => '3',
            '2' => '5',
            '4' => '6',
            '5' => '7',
            _ => c,
        })
        .collect();
    let mut s = sentences(&digits);
    if let Some(first) = s.first_mut() {
        let t = first.trim_start();
        let mut c = t.chars();
        let lowered: String = c.next().into_iter().flat_map(char::to_lowercase).chain(c).collect();
        *first = format!("Contrary to what many believe, it is not true that {lowered}");
    }
    s.concat()
}

/// Reworded and expanded by a third with an explanation and a caution.
fn expand(text: &str) -> String {
    format!(
        "{}\n\nWhy does this matter? Because each choice here shapes the next one: a vague goal leads to vague \
         questions, and vague questions lead to answers nobody can act on. Be careful, too, not to read one \
         person's opinion as the view of everyone; check it against what others say before you change course.",
        reword(text).trim_end()
    )
}

type Revise = fn(&str) -> String;

/// Revision kinds: name, whether the revision should count as converged, how it is made.
const KINDS: &[(&str, bool, Revise)] = &[
    ("reworded", true, reword),
    ("reordered", true, reorder),
    ("reformatted", true, reformat),
    ("example added", false, add_example),
    ("step removed", false, remove_step),
    ("fact corrected", false, correct_fact),
    ("expanded", false, expand),
];

/// About 20 KB of the fixtures' prose.
fn long_draft(sections: &[String]) -> String {
    let mut text = String::new();
    for s in sections.iter().cycle() {
        if text.len() >= 20_000 {
            break;
        }
        text.push_str(s);
        text.push_str("\n\n");
    }
    text.truncate(text.char_indices().take_while(|(i, _)| *i < 20_480).last().map_or(0, |(i, c)| i + c.len_utf8()));
    text
}

fn part_char_similarity(sections: &[String]) {
    let draft = long_draft(sections);
    let early = format!("{}A short reminder of what interest is comes first. {}", &draft[..200], &draft[200..]);
    let scattered = draft.replace(" the ", " a ").replace("dollars", "euros");
    let rewritten = reword(&reorder(&draft.chars().rev().collect::<String>()));
    println!("1. character similarity (exact Levenshtein over chars) on a {} byte draft", draft.len());
    println!("   {:<34} {:>10} {:>10} {:>10}", "revision", "similarity", "char ms", "jaccard ms");
    for (name, revised) in [
        ("early insertion (50 chars)", &early),
        ("scattered word edits", &scattered),
        ("whole text rewritten", &rewritten),
    ] {
        let sim = char_similarity(&draft, revised);
        let t_char = median_ms(15, || {
            std::hint::black_box(char_similarity(std::hint::black_box(&draft), std::hint::black_box(revised)));
        });
        let t_jac = median_ms(15, || {
            std::hint::black_box(jaccard(std::hint::black_box(&draft), std::hint::black_box(revised)));
        });
        println!("   {name:<34} {sim:>10.4} {t_char:>10.2} {t_jac:>10.2}");
    }
}

async fn part_embedding_step(sections: &[String]) {
    let dir = assay_embedded::default_models_dir();
    let paths = ModelPaths::in_dir(&dir);
    let t = Instant::now();
    let embedder = match LocalEmbedder::load(&paths.minilm_dir) {
        Ok(e) => e,
        Err(e) => {
            println!("2. skipped: all-MiniLM-L6-v2 not loaded ({e}); run `assay models fetch`");
            return;
        }
    };
    println!("\n2. the embedding step on the embedded backend (all-MiniLM-L6-v2 loaded in {:.0} ms)", ms(t.elapsed()));
    let embed = |texts: Vec<String>| {
        let e = embedder.clone();
        async move { e.embed(EmbeddingRequest { texts, ..Default::default() }).await.expect("embed").vectors }
    };
    embed(vec!["warm up".into()]).await;
    println!(
        "   {:<15} {:>5} {:>6} {:>6} {:>6} {:>8} {:>8} {:>8}",
        "kind", "pairs", "char", "jacc.", "step 3", "changed", "right w/o", "right w/"
    );
    let (mut total, mut undecided_total, mut changed_total, mut right_without, mut right_with) = (0, 0, 0, 0, 0);
    let mut embed_two = Vec::new();
    let mut embed_one = Vec::new();
    for (kind, should_converge, revise) in KINDS {
        let (mut by_char, mut by_jaccard, mut undecided, mut changed, mut rw, mut rwith) = (0, 0, 0, 0, 0, 0);
        for draft in sections {
            let revised = revise(draft);
            total += 1;
            match text_steps(draft, &revised) {
                TextSteps::Decided(o) => {
                    if o.jaccard.is_some() {
                        by_jaccard += 1;
                    } else {
                        by_char += 1;
                    }
                    // Decided before step 3: the same decision either way.
                    let right = usize::from(o.converged == *should_converge);
                    rw += right;
                    rwith += right;
                }
                TextSteps::NeedEmbedding(o) => {
                    undecided += 1;
                    let without = o.jaccard.is_some_and(|j| j.similarity >= JACCARD_CONVERGED - 1e-9);
                    let t = Instant::now();
                    let v = embed(vec![draft.clone(), revised.clone()]).await;
                    embed_two.push(ms(t.elapsed()));
                    let t = Instant::now();
                    embed(vec![revised.clone()]).await;
                    embed_one.push(ms(t.elapsed()));
                    let cos = assay_domain::similarity::cosine(&v[0], &v[1]).unwrap_or(0.0);
                    let with = cos >= EMBEDDING_CONVERGED - 1e-9;
                    changed += usize::from(with != without);
                    rw += usize::from(without == *should_converge);
                    rwith += usize::from(with == *should_converge);
                }
            }
        }
        println!(
            "   {kind:<15} {:>5} {by_char:>6} {by_jaccard:>6} {undecided:>6} {changed:>8} {rw:>8} {rwith:>8}",
            sections.len()
        );
        undecided_total += undecided;
        changed_total += changed;
        right_without += rw;
        right_with += rwith;
    }
    let mean = |v: &[f64]| if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 };
    println!(
        "   all: {total} pairs, {undecided_total} reach step 3, the step changes {changed_total} decisions; right \
         decisions without it {right_without}/{total}, with it {right_with}/{total}"
    );
    println!(
        "   cost per comparison reaching step 3: {:.1} ms (both vectors), {:.1} ms (one cached)",
        mean(&embed_two),
        mean(&embed_one)
    );
}

#[tokio::main]
async fn main() {
    let sections = sections();
    part_char_similarity(&sections);
    part_embedding_step(&sections).await;
}
