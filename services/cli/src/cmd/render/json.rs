//! The commands' JSON: any contract message in the proto3 JSON mapping, through its descriptor
//! (prost-reflect), with the options of the admin page (lowerCamelCase names, enums by name, 64-bit
//! integers as strings, defaults included) so the page and the CLI agree. A field added to a proto
//! reaches `--json` with no change here.

use assay_proto::common::v1 as common;
use assay_proto::gateway::v1 as gw;
use assay_proto::refiners::v1 as ref_pb;
use prost_reflect::prost::Message;
use prost_reflect::{DynamicMessage, MessageDescriptor, SerializeOptions};
use serde_json::{Map, Value};

/// Decode the contracts' descriptors now (a few milliseconds, once per process), so that the
/// first message printed does not wait for them: called on a thread of its own at start.
pub fn warm() {
    let _ = assay_proto::descriptor_pool();
}

/// A contract message the CLI prints, known by its full proto name.
pub trait Proto: Message + Sized {
    /// The full name (`assay.gateway.v1.Run`).
    const NAME: &'static str;
}

macro_rules! proto_names {
    ($($ty:ty => $name:literal,)*) => {
        $(impl Proto for $ty { const NAME: &'static str = $name; })*
    };
}

proto_names! {
    gw::Run => "assay.gateway.v1.Run",
    gw::RunEvent => "assay.gateway.v1.RunEvent",
    gw::RunResult => "assay.gateway.v1.RunResult",
    gw::EvaluateResponse => "assay.gateway.v1.EvaluateResponse",
    gw::TargetedRefinementResult => "assay.gateway.v1.TargetedRefinementResult",
    gw::RefinementProgress => "assay.gateway.v1.RefinementProgress",
    gw::EscalationTriggered => "assay.gateway.v1.EscalationTriggered",
    gw::DebateProblemResult => "assay.gateway.v1.DebateProblemResult",
    gw::SelfRefined => "assay.gateway.v1.SelfRefined",
    ref_pb::SelfRefineResponse => "assay.refiners.v1.SelfRefineResponse",
    common::Checklist => "assay.common.v1.Checklist",
}

/// The descriptor of `M`.
pub fn descriptor<M: Proto>() -> Result<MessageDescriptor, String> {
    let pool = assay_proto::descriptor_pool().map_err(str::to_string)?;
    pool.get_message_by_name(M::NAME).ok_or_else(|| format!("no message {} in the contract descriptors", M::NAME))
}

/// `message` as a dynamic message of its descriptor.
pub fn dynamic<M: Proto>(message: &M) -> Result<DynamicMessage, String> {
    DynamicMessage::decode(descriptor::<M>()?, message.encode_to_vec().as_slice())
        .map_err(|e| format!("decoding {}: {e}", M::NAME))
}

/// `message` in the proto3 JSON mapping.
pub fn to_json<M: Proto>(message: &M) -> Result<Value, String> {
    dynamic(message)?
        .serialize_with_options(serde_json::value::Serializer, &SerializeOptions::new().skip_default_fields(false))
        .map_err(|e| format!("encoding {} as JSON: {e}", M::NAME))
}

/// The field set in a oneof of `message` (`event` of a `RunEvent`): its proto name (snake case),
/// or None when none is.
#[cfg(test)]
pub fn oneof_case<M: Proto>(message: &M, oneof: &str) -> Option<String> {
    use prost_reflect::ReflectMessage as _;
    let dynamic = dynamic(message).ok()?;
    let desc = dynamic.descriptor();
    let group = desc.oneofs().find(|o| o.name() == oneof)?;
    group.fields().find(|f| dynamic.has_field(f)).map(|f| f.name().to_string())
}

/// A wire enum's value as the proto3 JSON mapping writes it (`RUN_STATE_SUCCEEDED`).
pub fn state_json(state: i32) -> Value {
    gw::RunState::try_from(state).map_or_else(|_| Value::from(state), |s| Value::from(s.as_str_name()))
}

/// `message` in the proto3 JSON mapping with the run it belongs to (`runId`, `state`): what a verb
/// prints when its run is over.
pub fn run_output<M: Proto>(run_id: &str, state: i32, message: &M) -> Result<Value, String> {
    let mut v = to_json(message)?;
    if let Value::Object(o) = &mut v {
        o.insert("runId".into(), run_id.into());
        o.insert("state".into(), state_json(state));
    }
    Ok(v)
}

/// An object of a run id, a state and more fields (already in the mapping).
pub fn envelope(run_id: &str, state: i32, fields: impl IntoIterator<Item = (&'static str, Value)>) -> Value {
    let mut o = Map::new();
    o.insert("runId".into(), run_id.into());
    o.insert("state".into(), state_json(state));
    for (k, v) in fields {
        o.insert(k.into(), v);
    }
    Value::Object(o)
}

#[cfg(test)]
mod tests {
    use prost_reflect::{Kind, Value as Field};

    use super::*;

    /// A value for every field of `desc` (nested messages one level deep), so each field has
    /// something to show.
    fn populated(desc: &MessageDescriptor, depth: u32) -> DynamicMessage {
        let mut m = DynamicMessage::new(desc.clone());
        for f in desc.fields() {
            if f.containing_oneof().is_some_and(|o| o.fields().next().is_some_and(|first| first != f)) {
                continue;
            }
            let one = match f.kind() {
                Kind::Double => Field::F64(0.5),
                Kind::Float => Field::F32(0.5),
                Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => Field::I32(7),
                Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => Field::I64(7),
                Kind::Uint32 | Kind::Fixed32 => Field::U32(7),
                Kind::Uint64 | Kind::Fixed64 => Field::U64(7),
                Kind::Bool => Field::Bool(true),
                Kind::String => Field::String("x".into()),
                Kind::Bytes => Field::Bytes(b"x".to_vec().into()),
                Kind::Enum(e) => Field::EnumNumber(e.values().last().map_or(0, |v| v.number())),
                Kind::Message(inner) if depth > 0 => Field::Message(populated(&inner, depth - 1)),
                Kind::Message(inner) => Field::Message(DynamicMessage::new(inner)),
            };
            let value = if f.is_map() {
                continue;
            } else if f.is_list() {
                Field::List(vec![one])
            } else {
                one
            };
            m.set_field(&f, value);
        }
        m
    }

    /// Every field of a fully populated message reaches the JSON under its proto3 JSON name: a
    /// field added to the contract needs no CLI change.
    fn every_field_reaches_json<M: Proto + Default>() {
        let desc = descriptor::<M>().unwrap();
        let message: M = populated(&desc, 2).transcode_to().unwrap();
        let v = to_json(&message).unwrap();
        let o = v.as_object().unwrap_or_else(|| panic!("{}: {v}", M::NAME));
        for f in desc.fields() {
            let set = f.containing_oneof().is_none_or(|o| o.fields().next().is_some_and(|first| first == f));
            if set && !f.is_map() {
                assert!(o.contains_key(f.json_name()), "{}.{} missing from {v}", M::NAME, f.json_name());
            }
        }
    }

    #[test]
    fn every_field_of_the_printed_messages_reaches_json() {
        every_field_reaches_json::<gw::Run>();
        every_field_reaches_json::<gw::RunEvent>();
        every_field_reaches_json::<gw::EvaluateResponse>();
        every_field_reaches_json::<gw::TargetedRefinementResult>();
        every_field_reaches_json::<gw::RefinementProgress>();
        every_field_reaches_json::<gw::EscalationTriggered>();
        every_field_reaches_json::<gw::DebateProblemResult>();
        every_field_reaches_json::<ref_pb::SelfRefineResponse>();
    }

    #[test]
    fn names_follow_the_proto3_json_mapping() {
        let run = gw::Run {
            run_id: "r1".into(),
            state: gw::RunState::AwaitingHuman as i32,
            last_sequence: 12,
            ..Default::default()
        };
        let v = to_json(&run).unwrap();
        assert_eq!(v["runId"], "r1");
        assert_eq!(v["state"], "RUN_STATE_AWAITING_HUMAN");
        // 64-bit integers are strings in the mapping; unset messages and oneofs are left out.
        assert_eq!(v["lastSequence"], "12");
        assert_eq!(v["recordsTotal"], 0);
        assert!(v.get("result").is_none() && v.get("refinement").is_none());
        let event = gw::RunEvent {
            event: Some(gw::run_event::Event::StateChanged(gw::RunStateChanged::default())),
            ..Default::default()
        };
        assert_eq!(oneof_case(&event, "event").as_deref(), Some("state_changed"));
        assert_eq!(oneof_case(&gw::RunEvent::default(), "event"), None);
        let v = run_output("r2", gw::RunState::Succeeded as i32, &ref_pb::SelfRefineResponse::default()).unwrap();
        assert_eq!((v["runId"].as_str(), v["state"].as_str()), (Some("r2"), Some("RUN_STATE_SUCCEEDED")));
        assert_eq!(v["finalText"], "");
    }
}
