//! Stage traits. The gateway holds them as `Arc<dyn ...>`: remote gRPC clients in production,
//! in-process cores in unit tests.

use serde::{Deserialize, Serialize};

use crate::Usage;

use crate::checklist::Checklist;
use crate::error::StageError;
use crate::model::{ModelRecord, ModelSpec};
use crate::score::{AggregateScores, Score, ScorerSettings};

/// One response to be judged.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ScoreTarget {
    pub id: String,
    pub input: String,
    pub target: String,
    pub reference: String,
    pub history: String,
}

/// Score targets against a checklist.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ScoreRequest {
    pub checklist: Checklist,
    pub targets: Vec<ScoreTarget>,
    /// Unset fields take the defaults of the preset named by the checklist's `source_method`.
    pub config: ScorerSettings,
    pub model: ModelSpec,
}

/// Scores in target order with their aggregate.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ScoreOutcome {
    pub scores: Vec<Score>,
    pub aggregate: AggregateScores,
    pub usage: Usage,
    pub model: ModelRecord,
}

/// Progress of a Score call.
#[derive(Debug, Clone, PartialEq)]
pub enum ScoreEvent {
    TargetScored { index: u32, score: Score },
}

/// Receives progress events; must not block.
pub type EventSink<'a, E> = &'a (dyn Fn(E) + Send + Sync);

/// Ignores events.
pub fn no_events<E>(_: E) {}

/// The scorer stage.
#[async_trait::async_trait]
pub trait Scorer: Send + Sync {
    async fn score(&self, request: ScoreRequest, events: EventSink<'_, ScoreEvent>)
    -> Result<ScoreOutcome, StageError>;
}
