//! Local embeddings against an independent reference (numpy float64 implementation of the
//! model, `scripts/models/minilm_reference.py`), and batch invariance.

mod common;

use assay_llm::{EmbeddingModel, EmbeddingRequest};
use serde_json::Value;

fn fixture() -> Value {
    serde_json::from_str(include_str!("fixtures/minilm_reference.json")).unwrap()
}

async fn embed(texts: &[&str]) -> Vec<Vec<f32>> {
    let req = EmbeddingRequest { texts: texts.iter().map(|s| s.to_string()).collect(), ..Default::default() };
    let resp = common::embedder().embed(req).await.expect("embed");
    assert_eq!(resp.vectors.len(), texts.len());
    assert_eq!(resp.model, "all-MiniLM-L6-v2");
    assert_eq!(resp.usage.calls, 1);
    resp.vectors
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum()
}

#[tokio::test]
async fn matches_reference_values() {
    let fx = fixture();
    let sentences = fx["sentences"].as_array().unwrap();
    let texts: Vec<&str> = sentences.iter().map(|s| s["text"].as_str().unwrap()).collect();
    let vectors = embed(&texts).await;
    for (s, v) in sentences.iter().zip(&vectors) {
        assert_eq!(v.len(), 384);
        let norm = dot(v, v).sqrt();
        assert!((norm - s["norm"].as_f64().unwrap()).abs() < 1e-4, "norm {norm}");
        for (i, want) in s["first8"].as_array().unwrap().iter().enumerate() {
            let want = want.as_f64().unwrap();
            assert!((f64::from(v[i]) - want).abs() < 1e-4, "{}: dim {i}: got {} want {want}", s["text"], v[i]);
        }
        let sum: f64 = v.iter().map(|x| f64::from(*x)).sum();
        assert!((sum - s["sum"].as_f64().unwrap()).abs() < 1e-3, "sum {sum}");
    }
    let cos = fx["cosine"].as_array().unwrap();
    for i in 0..vectors.len() {
        for j in 0..vectors.len() {
            let want = cos[i][j].as_f64().unwrap();
            assert!((dot(&vectors[i], &vectors[j]) - want).abs() < 1e-4);
        }
    }
}

#[tokio::test]
async fn identical_vectors_regardless_of_batch() {
    let target = "Is Paris the capital of France?";
    let alone = embed(&[target]).await.remove(0);
    let mut batch: Vec<String> = (0..40)
        .map(|i| match i % 4 {
            0 => "short".to_string(),
            1 => "a somewhat longer sentence that pads the batch with many more tokens than the target has".repeat(3),
            2 => format!("sentence number {i} of the mixed batch"),
            _ => "x".repeat(i * 7),
        })
        .collect();
    // In the first internal batch of 32 and in the second.
    batch.insert(5, target.to_string());
    batch.insert(37, target.to_string());
    let refs: Vec<&str> = batch.iter().map(String::as_str).collect();
    let vectors = embed(&refs).await;
    for idx in [5, 37] {
        let max_diff = alone.iter().zip(&vectors[idx]).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(max_diff < 1e-5, "batch position {idx}: max diff {max_diff}");
    }
}

#[tokio::test]
async fn long_texts_are_truncated_and_empty_batches_work() {
    let long = "word ".repeat(2000);
    let v = embed(&[&long, ""]).await;
    assert!((dot(&v[0], &v[0]).sqrt() - 1.0).abs() < 1e-4);
    assert!((dot(&v[1], &v[1]).sqrt() - 1.0).abs() < 1e-4);
    let none = common::embedder().embed(EmbeddingRequest::default()).await.unwrap();
    assert!(none.vectors.is_empty());
}

#[tokio::test]
async fn similar_texts_are_closer() {
    let v =
        embed(&["A cat sits on the mat.", "A kitten is sitting on a rug.", "Stock markets fell sharply today."]).await;
    assert!(dot(&v[0], &v[1]) > dot(&v[0], &v[2]) + 0.2);
}

/// Split into parts embedded at once (as the assay binaries run it), a batch gives the vectors it
/// gives whole, in the same order.
#[tokio::test]
async fn batches_split_across_workers_give_the_same_vectors() {
    let texts: Vec<String> =
        (0..37).map(|i| format!("sentence number {i} about {}", ["rain", "tax", "music"][i % 3])).collect();
    let whole = common::embedder().with_workers(1);
    let split = common::embedder().with_workers(3);
    let req = || EmbeddingRequest { texts: texts.clone(), ..Default::default() };
    let (a, b) = (whole.embed(req()).await.unwrap(), split.embed(req()).await.unwrap());
    assert_eq!(a.vectors.len(), 37);
    assert_eq!(a.usage.prompt_tokens, b.usage.prompt_tokens);
    for (x, y) in a.vectors.iter().zip(&b.vectors) {
        let diff = x.iter().zip(y).map(|(p, q)| (p - q).abs()).fold(0f32, f32::max);
        assert!(diff < 1e-5, "max difference {diff}");
    }
}
