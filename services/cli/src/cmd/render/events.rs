//! Every kind of run event and how the CLI words it: the one place that lists them. `assay runs
//! watch` prints every event through [`line`]; the verbs act on the kinds their pipeline sends
//! (a progress bar, a record written) and word them through the same functions. A kind added to
//! the proto fails to compile here until it has a name and a line, and
//! `every_event_kind_of_the_proto_is_named_and_worded` fails until the name is the proto's.

use assay_proto::gateway::v1 as gw;

use super::super::follow::finished;
use super::{
    checklist_eval, debate, kind_name, plural, self_refine, stage_progress_line, state_line, state_name,
    targeted_refinement,
};

/// A run's completion in the words of the verbs: its state, or why it has no result.
pub fn completed_line(run_id: &str, c: &gw::RunCompleted) -> String {
    match finished(c.state, c.result.clone()) {
        Ok(_) => format!("completed: {}", state_name(c.state)),
        Err(e) => format!("completed: {}", e.message(run_id)),
    }
}

/// The event in words, one line: refinement events as `assay refine` says them, self-refine
/// passes as `assay refine-text`, finished problems as `assay debate`, the completion as the
/// verbs read a finished run.
pub fn line(e: &gw::RunEvent) -> String {
    use gw::run_event::Event;
    match &e.event {
        Some(Event::Started(s)) => {
            let work = plural(s.records as usize, "unit");
            match kind_name(s.kind).as_str() {
                "unspecified" => format!("run started: {work} of work"),
                kind => format!("{kind} run started: {work} of work"),
            }
        }
        Some(Event::Progress(p)) => {
            let stage = p.progress.as_ref().map_or_else(|| "progress".to_string(), stage_progress_line);
            if p.service.is_empty() { stage } else { format!("{}: {stage}", p.service) }
        }
        Some(Event::ChecklistReady(c)) => checklist_eval::checklist_ready_line(c),
        Some(Event::RecordScored(r)) => checklist_eval::record_line(r),
        Some(Event::Aggregate(a)) => match &a.aggregate {
            Some(a) => format!(
                "aggregate: {}, mean score {:.4}, pass rate {:.4}",
                plural(a.targets as usize, "target"),
                a.mean_primary_score,
                a.macro_pass_rate
            ),
            None => "aggregate: none".to_string(),
        },
        Some(Event::Refinement(r)) => targeted_refinement::progress_line(&e.run_id, r)
            .map_or_else(|| format!("refinement event of iteration {}", r.iteration), |l| l.trim_start().to_string()),
        Some(Event::SelfRefinePass(p)) => self_refine::pass_line(p),
        Some(Event::DebateStage(d)) => debate::stage_line(d),
        Some(Event::StateChanged(s)) => state_line(s),
        Some(Event::Completed(c)) => completed_line(&e.run_id, c),
        Some(Event::DebateProblemDone(p)) => debate::problem_line(p),
        Some(Event::SelfRefined(r)) => self_refine::self_refined_line(r),
        Some(Event::RecordsClaimed(c)) => format!(
            "records {}-{} claimed by gateway {}{}",
            c.first,
            (c.first + u64::from(c.count)).saturating_sub(1),
            c.gateway,
            if c.takeover { " (taken over from an expired claim)" } else { "" }
        ),
        Some(Event::ComparisonUpdated(c)) => checklist_eval::comparison_line(c),
        None => "an event of a kind this CLI does not know (a newer gateway's)".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use prost::Message as _;
    use prost_reflect::{DynamicMessage, Value};

    use super::super::json::oneof_case;
    use super::*;

    /// A `RunEvent` with its `event` member `field` set to that message's defaults, made from the
    /// proto's descriptor (not from the Rust enum), so a kind added to the proto is found here.
    fn event_of(field: &prost_reflect::FieldDescriptor) -> gw::RunEvent {
        let descriptor = field.parent_message();
        let mut message = DynamicMessage::new(descriptor.clone());
        let kind = field.kind();
        let inner = kind.as_message().expect("every event member is a message");
        message.set_field(field, Value::Message(DynamicMessage::new(inner.clone())));
        message.set_field_by_name("run_id", Value::String("r1".into()));
        gw::RunEvent::decode(message.encode_to_vec().as_slice()).expect("decodes as the generated type")
    }

    #[test]
    fn every_event_kind_of_the_proto_is_worded() {
        let pool = assay_proto::descriptor_pool().expect("the descriptor pool");
        let run_event = pool.get_message_by_name("assay.gateway.v1.RunEvent").expect("RunEvent");
        let oneof = run_event.oneofs().find(|o| o.name() == "event").expect("RunEvent's event oneof");
        let mut seen = 0;
        for field in oneof.fields() {
            let event = event_of(&field);
            assert_eq!(oneof_case(&event, "event").as_deref(), Some(field.name()), "decoded as its own kind");
            let words = line(&event);
            assert!(!words.trim().is_empty() && !words.contains("does not know"), "{}: {words:?}", field.name());
            seen += 1;
        }
        assert!(seen >= 13, "{seen} event kinds");
        assert!(line(&gw::RunEvent::default()).contains("does not know"));
    }
}
