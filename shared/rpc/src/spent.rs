//! What a failed call spent and what a refused model call needed, carried on its status as
//! metadata ([`assay_budget::SPENT_HEADER`], [`assay_budget::NEED_HEADER`]) for the caller to
//! charge and learn from.

/// `status` carrying what a refused model call needed (with what was spent before it), when one
/// was refused for lack of budget ([`assay_budget::NEED_HEADER`]).
pub fn with_need(mut status: tonic::Status, need: Option<assay_budget::Cost>) -> tonic::Status {
    if let Some(need) = need
        && let Ok(v) = tonic::metadata::MetadataValue::try_from(need.header_value())
    {
        status.metadata_mut().insert(assay_budget::NEED_HEADER, v);
    }
    status
}

/// `status` carrying `spent` (when anything was), for the caller to charge
/// ([`assay_budget::SPENT_HEADER`]).
pub fn with_spent(mut status: tonic::Status, spent: &assay_domain::Usage) -> tonic::Status {
    if spent.calls > 0 || spent.tokens() > 0 || spent.unpriced_calls > 0 {
        let bytes = prost::Message::encode_to_vec(&assay_proto::convert::usage_to(spent));
        status
            .metadata_mut()
            .insert_bin(assay_budget::SPENT_HEADER, tonic::metadata::MetadataValue::from_bytes(&bytes));
    }
    status
}

/// Charge the usage a failed call's `status` says its model calls spent to the caller's sink
/// ([`assay_budget::charge_failed_call`]).
pub fn charge_spent(status: &tonic::Status) {
    // What a refused model call of the stage needed: the caller's slice learns it.
    if let Some(need) = status.metadata().get(assay_budget::NEED_HEADER).and_then(|v| v.to_str().ok())
        && let (Some(need), Some(budget)) = (assay_budget::Cost::from_header(need), assay_budget::current())
    {
        budget.note_refused(need);
    }
    let Some(value) = status.metadata().get_bin(assay_budget::SPENT_HEADER) else { return };
    let Ok(bytes) = value.to_bytes() else { return };
    if let Ok(usage) = <assay_proto::common::v1::Usage as prost::Message>::decode(bytes) {
        assay_budget::charge_failed_call(&assay_proto::convert::usage_from(Some(usage)));
    }
}
