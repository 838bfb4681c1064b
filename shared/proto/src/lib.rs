//! Generated code for Assay's v1 contracts (messages, clients and servers), one module per package.

/// Encoded `FileDescriptorSet` of every Assay contract, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/assay_descriptor.bin"));

pub mod convert;
pub mod pipelines;

/// The contracts' descriptors (every Assay package and its imports), decoded once per process:
/// for code that reads messages by field name (the admin API's JSON, the backends a request
/// names in its model specs).
pub fn descriptor_pool() -> Result<&'static prost_reflect::DescriptorPool, &'static str> {
    static POOL: std::sync::LazyLock<Result<prost_reflect::DescriptorPool, String>> = std::sync::LazyLock::new(|| {
        prost_reflect::DescriptorPool::decode(FILE_DESCRIPTOR_SET).map_err(|e| format!("contract descriptors: {e}"))
    });
    POOL.as_ref().map_err(String::as_str)
}

#[allow(clippy::all, clippy::pedantic, rust_2018_idioms)]
pub mod common {
    pub mod v1 {
        tonic::include_proto!("assay.common.v1");
    }
}
#[allow(clippy::all, clippy::pedantic, rust_2018_idioms)]
pub mod generator {
    pub mod v1 {
        tonic::include_proto!("assay.generator.v1");
    }
}
#[allow(clippy::all, clippy::pedantic, rust_2018_idioms)]
pub mod refiners {
    pub mod v1 {
        tonic::include_proto!("assay.refiners.v1");
    }
}
#[allow(clippy::all, clippy::pedantic, rust_2018_idioms)]
pub mod scorer {
    pub mod v1 {
        tonic::include_proto!("assay.scorer.v1");
    }
}
#[allow(clippy::all, clippy::pedantic, rust_2018_idioms)]
pub mod arbiter {
    pub mod v1 {
        tonic::include_proto!("assay.arbiter.v1");
    }
}
#[allow(clippy::all, clippy::pedantic, rust_2018_idioms)]
pub mod delta_judge {
    pub mod v1 {
        tonic::include_proto!("assay.delta_judge.v1");
    }
}
#[allow(clippy::all, clippy::pedantic, rust_2018_idioms)]
pub mod debate {
    pub mod v1 {
        tonic::include_proto!("assay.debate.v1");
    }
}
#[allow(clippy::all, clippy::pedantic, rust_2018_idioms)]
pub mod gateway {
    pub mod v1 {
        tonic::include_proto!("assay.gateway.v1");
    }
}

/// Fully qualified service names, as health and reflection report them.
pub mod service_names {
    pub const GATEWAY: &str = "assay.gateway.v1.GatewayService";
    pub const GENERATOR: &str = "assay.generator.v1.GeneratorService";
    pub const REFINERS: &str = "assay.refiners.v1.RefinersService";
    pub const SCORER: &str = "assay.scorer.v1.ScorerService";
    pub const ARBITER: &str = "assay.arbiter.v1.ArbiterService";
    pub const DELTA_JUDGE: &str = "assay.delta_judge.v1.DeltaJudgeService";
    pub const DEBATE: &str = "assay.debate.v1.DebateService";
}
