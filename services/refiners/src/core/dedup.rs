//! Deduplicator: embed every question (one batched call), link pairs with cosine >= threshold,
//! take connected components (transitive), keep singletons, merge each larger cluster into one
//! question with one model call (concurrent, bounded).

use std::collections::HashSet;

use assay_domain::template::render;
use assay_domain::{ChecklistItem, StageError, UnusableReply, Usage};
use assay_llm::json::{preview, reply_json};
use assay_llm::{ChatResponse, ResponseFormat};
use futures::StreamExt;
use serde_json::{Value, json};

use super::base::{ChecklistRefiners, ItemFailure, MERGE_TEMPLATE, chat_request};
use assay_domain::refiners::{ActionKind, DEFAULT_DEDUP_THRESHOLD, DedupOptions, RefinerAction, StepOutcome, names};

/// Max tokens of a merge reply unless configured.
const MERGE_MAX_TOKENS: u32 = 256;
/// Longest merged question the schema allows (characters).
const MAX_MERGED_CHARS: u32 = 300;

/// Cosine similarities of every pair of vectors, as an n x n matrix (row-major). A zero vector has
/// similarity 0 with everything.
#[derive(Debug, Clone, PartialEq)]
pub struct Similarity {
    n: usize,
    data: Vec<f64>,
}

impl Similarity {
    /// From explicit rows (tests, hand-built cases). Panics unless `rows` is square.
    pub fn from_rows(rows: &[Vec<f64>]) -> Self {
        let n = rows.len();
        assert!(rows.iter().all(|r| r.len() == n), "similarity rows must be square");
        Self { n, data: rows.iter().flatten().copied().collect() }
    }

    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    pub fn get(&self, i: usize, j: usize) -> f64 {
        self.data[i * self.n + j]
    }

    /// Row `i`: similarities of item `i` to every item.
    pub fn row(&self, i: usize) -> &[f64] {
        &self.data[i * self.n..(i + 1) * self.n]
    }
}

/// Unit-length f64 copies of `vectors` (zero vectors stay zero).
fn normalized(vectors: &[Vec<f32>]) -> Vec<Vec<f64>> {
    vectors
        .iter()
        .map(|v| {
            let norm = v.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>().sqrt();
            if norm > 0.0 { v.iter().map(|x| f64::from(*x) / norm).collect() } else { vec![0.0; v.len()] }
        })
        .collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The cosine similarity matrix of `vectors` (symmetric; diagonal 1 for non-zero vectors).
pub fn cosine_matrix(vectors: &[Vec<f32>]) -> Similarity {
    let unit = normalized(vectors);
    let n = unit.len();
    let mut data = vec![0.0; n * n];
    for i in 0..n {
        data[i * n + i] = dot(&unit[i], &unit[i]);
        for j in i + 1..n {
            let s = dot(&unit[i], &unit[j]);
            data[i * n + j] = s;
            data[j * n + i] = s;
        }
    }
    Similarity { n, data }
}

/// Connected components of the "cosine >= threshold" graph.
#[derive(Debug, Clone, PartialEq)]
pub struct Clustering {
    /// Components ordered by their first member; members ascending.
    pub clusters: Vec<Vec<usize>>,
    /// Per item, the highest cosine to any other item (0 with a single item).
    pub nearest: Vec<f64>,
}

fn find(parent: &mut [usize], mut x: usize) -> usize {
    while parent[x] != x {
        parent[x] = parent[parent[x]];
        x = parent[x];
    }
    x
}

/// Cluster `vectors`: an edge joins i and j when their cosine is >= `threshold`; clusters are the
/// connected components (so A~B and B~C put A, B and C together even when A !~ C).
pub fn cluster(vectors: &[Vec<f32>], threshold: f64) -> Clustering {
    let unit = normalized(vectors);
    let n = unit.len();
    let mut parent: Vec<usize> = (0..n).collect();
    let mut nearest = vec![f64::NEG_INFINITY; n];
    for i in 0..n {
        for j in i + 1..n {
            let s = dot(&unit[i], &unit[j]);
            nearest[i] = nearest[i].max(s);
            nearest[j] = nearest[j].max(s);
            if s >= threshold {
                let (a, b) = (find(&mut parent, i), find(&mut parent, j));
                if a != b {
                    // The smaller index becomes the root, so roots are first members.
                    let (lo, hi) = if a < b { (a, b) } else { (b, a) };
                    parent[hi] = lo;
                }
            }
        }
    }
    let mut slot_of_root = vec![usize::MAX; n];
    let mut clusters: Vec<Vec<usize>> = Vec::new();
    for i in 0..n {
        let r = find(&mut parent, i);
        if slot_of_root[r] == usize::MAX {
            slot_of_root[r] = clusters.len();
            clusters.push(Vec::new());
        }
        clusters[slot_of_root[r]].push(i);
    }
    let nearest = nearest.into_iter().map(|s| if s.is_finite() { s } else { 0.0 }).collect();
    Clustering { clusters, nearest }
}

/// The JSON schema of a merge reply.
fn merge_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"question": {"type": "string", "minLength": 1, "maxLength": MAX_MERGED_CHARS}},
        "required": ["question"],
        "additionalProperties": false
    })
}

/// The merged question of a reply: `{"question": ...}`, a JSON string, or (as the original does)
/// the plain reply text when it holds no JSON.
pub(crate) fn parse_merge(reply: &ChatResponse) -> Result<String, UnusableReply> {
    let question = match reply_json(reply) {
        Some(Value::Object(map)) => match map.get("question") {
            Some(Value::String(q)) => q.trim().to_string(),
            Some(_) | None => return Err("the reply's JSON has no \"question\" string".into()),
        },
        Some(Value::String(q)) => q.trim().to_string(),
        Some(_) => return Err(format!("the reply is not a question (reply {:?})", preview(&reply.text, 80)).into()),
        None => {
            let t = reply.text.trim().trim_matches('"').trim();
            if t.starts_with('{') || t.starts_with('[') {
                return Err(format!("the reply holds broken JSON (reply {:?})", preview(t, 80)).into());
            }
            t.to_string()
        }
    };
    if question.is_empty() {
        return Err("the merged question is empty".into());
    }
    Ok(question)
}

fn fmt_ids(items: &[&ChecklistItem]) -> String {
    items.iter().map(|i| i.id.as_str()).collect::<Vec<_>>().join(", ")
}

/// A free id: `base`, else `base-2`, `base-3`, ...
fn unique_id(base: String, taken: &mut HashSet<String>) -> String {
    let mut id = base.clone();
    let mut k = 2;
    while taken.contains(&id) {
        id = format!("{base}-{k}");
        k += 1;
    }
    taken.insert(id.clone());
    id
}

/// The merged item of a cluster: id = first id + "-merged", weight = mean weight, category of the
/// first member, merged ids and original questions recorded (fields and metadata), source indices
/// united.
pub(crate) fn merged_item(members: &[&ChecklistItem], question: String, id: String) -> ChecklistItem {
    let first = members[0];
    let mut item = ChecklistItem::new(id, question);
    item.weight = members.iter().map(|m| m.weight).sum::<f64>() / members.len() as f64;
    item.category = first.category.clone();
    item.merged_from = members.iter().map(|m| m.id.clone()).collect();
    let mut sources: Vec<u32> = members.iter().flat_map(|m| m.source_indices.iter().copied()).collect();
    sources.sort_unstable();
    sources.dedup();
    item.source_indices = sources;
    item.metadata.insert("merged_from".into(), json!(item.merged_from).to_string());
    item.metadata.insert(
        "original_questions".into(),
        json!(members.iter().map(|m| &m.question).collect::<Vec<_>>()).to_string(),
    );
    item
}

pub(super) async fn run(
    core: &ChecklistRefiners,
    items: Vec<ChecklistItem>,
    options: &DedupOptions,
) -> Result<StepOutcome, StageError> {
    let threshold = options.threshold.unwrap_or(DEFAULT_DEDUP_THRESHOLD);
    if items.len() <= 1 {
        let actions = items
            .iter()
            .map(|it| RefinerAction::new(names::DEDUPLICATOR, &it.id, ActionKind::Kept, "only item: nothing to merge"))
            .collect();
        return Ok(StepOutcome { items, actions, ..Default::default() });
    }
    // Resolve both models before the first call, so a bad backend name costs nothing.
    let chat = core.chat(&options.model, "model")?;
    core.hub.embedding(super::base::PHASE, &options.embedding_model, "embedding_model")?;
    let mut usage = Usage::default();
    let texts = items.iter().map(|i| i.question.clone()).collect();
    let (vectors, u) = core.embed(&options.embedding_model, "embedding_model", texts).await?;
    usage.add(&u);
    let Clustering { clusters, nearest } = cluster(&vectors, threshold);

    // One merge call per multi-item cluster, concurrently (bounded), in cluster order.
    let multi: Vec<usize> = (0..clusters.len()).filter(|&c| clusters[c].len() > 1).collect();
    let chat = &chat;
    let items_ref = &items;
    let clusters_ref = &clusters;
    let replies: Vec<_> = futures::stream::iter(multi.iter().copied())
        .map(|c| async move {
            let questions: String =
                clusters_ref[c].iter().map(|&i| format!("- {}\n", items_ref[i].question.trim())).collect();
            let prompt = render(MERGE_TEMPLATE, &[("questions", questions.trim_end())]);
            let req = chat_request(
                chat,
                prompt,
                ResponseFormat::JsonSchema { name: "merged_question".into(), schema: merge_schema() },
                MERGE_MAX_TOKENS,
            );
            (c, chat.model.chat(req).await)
        })
        .buffered(core.concurrency)
        .collect()
        .await;
    let mut merges: Vec<Option<Result<String, ItemFailure>>> = vec![None; clusters.len()];
    for (c, reply) in replies {
        let merged = match reply {
            Ok(r) => {
                usage.add(&r.usage);
                parse_merge(&r).map_err(|why| ItemFailure::Unparsed { step: "merge", why })
            }
            Err(e) if e.is_transient() => Err(ItemFailure::Call { step: "merge", error: e }),
            Err(e) => return Err(e.into()),
        };
        merges[c] = Some(merged);
    }

    let mut taken: HashSet<String> = items.iter().map(|i| i.id.clone()).collect();
    let mut out = Vec::with_capacity(clusters.len());
    // One action per input item, in input order.
    let mut actions: Vec<Option<RefinerAction>> = vec![None; items.len()];
    let mut clusters_merged = 0u32;
    let mut parse_failures = 0u32;
    for (c, members) in clusters.iter().enumerate() {
        if let [only] = members.as_slice() {
            let it = &items[*only];
            actions[*only] = Some(RefinerAction::new(
                names::DEDUPLICATOR,
                &it.id,
                ActionKind::Kept,
                format!("unique: closest other question at cosine {:.3} < threshold {threshold}", nearest[*only]),
            ));
            out.push(it.clone());
            continue;
        }
        let member_items: Vec<&ChecklistItem> = members.iter().map(|&i| &items[i]).collect();
        match merges[c].take().unwrap_or(Err(ItemFailure::NoReply { step: "merge" })) {
            Ok(question) => {
                let id = unique_id(format!("{}-merged", member_items[0].id), &mut taken);
                for (&i, it) in members.iter().zip(&member_items) {
                    let others: Vec<&ChecklistItem> = member_items.iter().copied().filter(|o| o.id != it.id).collect();
                    let mut a = RefinerAction::new(
                        names::DEDUPLICATOR,
                        &it.id,
                        ActionKind::Merged,
                        format!(
                            "cluster of {} near-duplicates ({}): merged with {}; closest at cosine {:.3} >= threshold {threshold}",
                            members.len(),
                            fmt_ids(&member_items),
                            fmt_ids(&others),
                            nearest[i]
                        ),
                    );
                    a.result_item_id = id.clone();
                    actions[i] = Some(a);
                }
                out.push(merged_item(&member_items, question, id));
                clusters_merged += 1;
            }
            Err(why) => {
                // Reported, never silent: the cluster stays as it was, each member flagged.
                parse_failures += 1;
                for (&i, it) in members.iter().zip(&member_items) {
                    actions[i] = Some(RefinerAction::new(
                        names::DEDUPLICATOR,
                        &it.id,
                        ActionKind::Error,
                        format!(
                            "cluster of {} near-duplicates ({}) kept unmerged: {why}",
                            members.len(),
                            fmt_ids(&member_items)
                        ),
                    ));
                    out.push((*it).clone());
                }
            }
        }
    }
    tracing::debug!(items = items.len(), clusters_merged, parse_failures, "deduplicated");
    let actions = actions.into_iter().flatten().collect();
    Ok(StepOutcome { items: out, actions, usage, clusters_merged, parse_failures, ..Default::default() })
}
