//! ListRunResults: a checklist_eval run's record results, by position, a page at a time. A finished
//! run that carries its results inline pages them from its summary; an open run (or one still
//! executing) from the run engine's stored results (`assay_runs::Results`).

use assay_domain::StageError;
use assay_proto::gateway::v1 as gw;
use assay_runs::Engine;

use super::super::checklist::CHECKLIST;

/// Results per page: the default, and the most.
const DEFAULT_PAGE: usize = 1000;
const MAX_PAGE: usize = 10_000;

fn bad_token() -> StageError {
    StageError::invalid("page_token", "is not a token from ListRunResults")
}

/// One page of `run_id`'s results after the record `page_token` names (empty: from the first).
pub async fn list_run_results(
    engine: &Engine,
    request: gw::ListRunResultsRequest,
) -> Result<gw::ListRunResultsResponse, StageError> {
    let gw::ListRunResultsRequest { run_id, page_size, page_token } = request;
    if run_id.is_empty() {
        return Err(StageError::invalid("run_id", "must not be empty"));
    }
    let size = match page_size as usize {
        0 => DEFAULT_PAGE,
        n if n > MAX_PAGE => return Err(StageError::invalid("page_size", format!("is {n}; the limit is {MAX_PAGE}"))),
        n => n,
    };
    // The token is the position of the page's first record.
    let first: u64 = match page_token.as_str() {
        "" => 0,
        t => t.parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(bad_token)?,
    };
    let run = engine.get(&run_id).await?;
    if run.kind != gw::PipelineKind::ChecklistEval as i32 {
        return Err(StageError::FailedPrecondition(format!(
            "run {run_id} is a {} run; only checklist_eval runs have record results",
            gw::PipelineKind::try_from(run.kind).map_or("unknown", |k| k.as_str_name())
        )));
    }
    let total = u64::from(run.records_total);
    if let Some(gw::run_result::Result::ChecklistEval(e)) = run.result.and_then(|r| r.result)
        && !e.results_paged
    {
        let start = usize::try_from(first).unwrap_or(usize::MAX).min(e.results.len());
        let end = start.saturating_add(size).min(e.results.len());
        let next = if end < e.results.len() { end.to_string() } else { String::new() };
        return Ok(gw::ListRunResultsResponse {
            results: e.results[start..end].to_vec(),
            next_page_token: next,
            records_total: total,
        });
    }
    let page = engine.results_page(&run_id, first, size).await?;
    let full = page.len() == size;
    let mut results = Vec::with_capacity(page.len());
    for (_, bytes) in page {
        results.push(
            <gw::RecordResult as prost::Message>::decode(bytes.as_slice())
                .map_err(|e| StageError::Internal(format!("run store: corrupt result: {e}")))?,
        );
    }
    let next = match results.last() {
        Some(last) if full => (u64::from(last.index) + 1).to_string(),
        Some(_) | None => String::new(),
    };
    Ok(gw::ListRunResultsResponse { results, next_page_token: next, records_total: total })
}

/// An open run's evaluation made whole for what reads it at once (CompareRuns): every result,
/// page by page, and every stored checklist. Memory grows with the run: comparing pairs records
/// by id.
pub async fn complete_paged(engine: &Engine, e: &mut gw::EvaluateResponse) -> Result<(), StageError> {
    if !e.results_paged {
        return Ok(());
    }
    let mut token = String::new();
    loop {
        let request =
            gw::ListRunResultsRequest { run_id: e.run_id.clone(), page_size: MAX_PAGE as u32, page_token: token };
        let page = list_run_results(engine, request).await?;
        e.results.extend(page.results);
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let mut after = String::new();
    loop {
        let page = engine.store().checkpoints_page(&e.run_id, CHECKLIST, &after, MAX_PAGE).await?;
        let Some((last, _)) = page.last() else { break };
        after.clone_from(last);
        for (_, bytes) in page {
            e.checklists.push(
                <assay_proto::common::v1::Checklist as prost::Message>::decode(bytes.as_slice())
                    .map_err(|e| StageError::Internal(format!("run store: corrupt checklist: {e}")))?,
            );
        }
    }
    e.results_paged = false;
    Ok(())
}
