//! The arbiter over real gRPC on port 0.

use assay_proto::arbiter::v1::arbiter_service_client::ArbiterServiceClient;
use assay_proto::arbiter::v1::{ComputeAgreementRequest, LevelOfMeasurement, OptionalValue, RaterValues};
use assay_testkit::TestServer;
use tonic::Code;
use tonic_types::StatusExt;

async fn client() -> (TestServer, ArbiterServiceClient<tonic::transport::Channel>) {
    // Agreement needs no model: a hub without backends.
    let core = assay_arbiter::ArbiterCore::new(std::sync::Arc::new(assay_llm::ModelHub::default()));
    let server =
        TestServer::start(assay_arbiter::routes(std::sync::Arc::new(core)), &[assay_proto::service_names::ARBITER])
            .await;
    let client = ArbiterServiceClient::new(server.channel().await);
    (server, client)
}

fn raters(rows: &[&[Option<f64>]]) -> Vec<RaterValues> {
    rows.iter().map(|r| RaterValues { values: r.iter().map(|v| OptionalValue { value: *v }).collect() }).collect()
}

#[tokio::test]
async fn compute_agreement_gives_alpha_or_says_why_not() {
    let (_server, mut client) = client().await;
    // Krippendorff's worked example, interval (the level when unset): 0.8491071428571428 per the
    // Python package.
    let (n, s) = (None, Some);
    let example = raters(&[
        &[s(1.0), s(2.0), s(3.0), s(3.0), s(2.0), s(1.0), s(4.0), s(1.0), s(2.0), n, n, n],
        &[s(1.0), s(2.0), s(3.0), s(3.0), s(2.0), s(2.0), s(4.0), s(1.0), s(2.0), s(5.0), n, s(3.0)],
        &[n, s(3.0), s(3.0), s(3.0), s(2.0), s(3.0), s(4.0), s(2.0), s(2.0), s(5.0), s(1.0), n],
        &[s(1.0), s(2.0), s(3.0), s(3.0), s(2.0), s(4.0), s(4.0), s(1.0), s(2.0), s(5.0), s(1.0), n],
    ]);
    let reply = client
        .compute_agreement(ComputeAgreementRequest { raters: example.clone(), level: 0 })
        .await
        .unwrap()
        .into_inner();
    assert!((reply.alpha.unwrap() - 0.849_107_142_857_142_8).abs() < 1e-9, "{reply:?}");
    assert_eq!(reply.pairable_units, 11);
    assert!(reply.undefined_reason.is_empty());
    let nominal = client
        .compute_agreement(ComputeAgreementRequest { raters: example, level: LevelOfMeasurement::Nominal as i32 })
        .await
        .unwrap()
        .into_inner();
    assert!((nominal.alpha.unwrap() - 0.743_421_052_631_579).abs() < 1e-9);

    // All equal: unset with the reason, never NaN.
    let reply = client
        .compute_agreement(ComputeAgreementRequest { raters: raters(&[&[s(3.0), s(3.0)], &[s(3.0), n]]), level: 0 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.alpha, None);
    assert!(reply.undefined_reason.contains("fewer than two distinct values"), "{reply:?}");
}

#[tokio::test]
async fn bad_agreement_requests_name_the_field() {
    let (_server, mut client) = client().await;
    let cases = [
        (ComputeAgreementRequest { raters: vec![], level: 0 }, "raters"),
        (ComputeAgreementRequest { raters: raters(&[&[Some(1.0)], &[Some(2.0)]]), level: 9 }, "level"),
        (
            ComputeAgreementRequest { raters: raters(&[&[Some(1.0), Some(f64::NAN)], &[Some(2.0), None]]), level: 0 },
            "raters[0].values[1].value",
        ),
    ];
    for (request, field) in cases {
        let err = client.compute_agreement(request).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}");
        let fields: Vec<String> =
            err.get_details_bad_request().unwrap().field_violations.into_iter().map(|v| v.field).collect();
        assert_eq!(fields, vec![field.to_string()]);
    }
}
