//! Request limits, enforced by every service and documented in docs/limits.md.

/// Maximum items in one checklist.
pub const MAX_CHECKLIST_ITEMS: usize = 500;
/// Maximum bytes of one question.
pub const MAX_QUESTION_BYTES: usize = 4 * 1024;
/// Maximum bytes of one text field (input, target, reference, history, draft).
pub const MAX_TEXT_BYTES: usize = 256 * 1024;
/// Maximum targets in one Score request.
pub const MAX_TARGETS: usize = 1_000;
/// Maximum records in one pipeline request (and in one AppendRecords message).
pub const MAX_RECORDS: usize = 10_000;
/// Records of one open run (RunPipelineRequest.open; appended at most MAX_RECORDS per message).
/// A result is keyed by its index in eight digits, and at this size the run store holds some
/// 25 GB of a run's rows (about 2.5 KB per tick record with its checklist, result and events):
/// past it, split the data into several runs.
pub const MAX_RUN_RECORDS: u64 = 10_000_000;
/// Maximum bytes of a custom prompt template.
pub const MAX_TEMPLATE_BYTES: usize = 32 * 1024;
/// Maximum bytes of an id (checklist, item, record) or an item category.
pub const MAX_ID_BYTES: usize = 256;
/// Maximum bytes of a run label.
pub const MAX_LABEL_BYTES: usize = 1024;
/// Maximum gRPC message size (decode and encode), bytes.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// Maximum characters of a run control's actor (kept in the audit log, returned by every GetRun).
pub const MAX_ACTOR_CHARS: usize = 200;
/// Maximum characters of a run control's reason (kept in the audit log, returned by every GetRun).
pub const MAX_REASON_CHARS: usize = 2_000;
