//! The backends a request names in its model specs, found by reflection over the contract.

use std::collections::BTreeSet;

use assay_proto::gateway::v1 as gw;
use prost_reflect::{DynamicMessage, ReflectMessage, Value};

/// Add to `out` every backend named by a model spec anywhere in `request`.
pub(super) fn named_backends(request: &gw::RunPipelineRequest, out: &mut BTreeSet<String>) {
    let Ok(pool) = assay_proto::descriptor_pool() else { return };
    let Some(desc) = pool.get_message_by_name("assay.gateway.v1.RunPipelineRequest") else { return };
    let Ok(msg) = DynamicMessage::decode(desc, prost::Message::encode_to_vec(request).as_slice()) else { return };
    walk(&msg, out);
}

fn walk(msg: &DynamicMessage, out: &mut BTreeSet<String>) {
    if msg.descriptor().full_name() == "assay.common.v1.ModelSpec" {
        if let Some(Value::String(b)) = msg.get_field_by_name("backend").as_deref()
            && !b.is_empty()
        {
            out.insert(b.clone());
        }
        return;
    }
    for (_, value) in msg.fields() {
        visit(value, out);
    }
}

fn visit(value: &Value, out: &mut BTreeSet<String>) {
    match value {
        Value::Message(m) => walk(m, out),
        Value::List(items) => items.iter().for_each(|v| visit(v, out)),
        Value::Map(entries) => entries.values().for_each(|v| visit(v, out)),
        Value::Bool(_)
        | Value::I32(_)
        | Value::I64(_)
        | Value::U32(_)
        | Value::U64(_)
        | Value::F32(_)
        | Value::F64(_)
        | Value::String(_)
        | Value::Bytes(_)
        | Value::EnumNumber(_) => {}
    }
}
