//! `assay-refiners`: one service of the mesh on its own (its row of the stage table in `assay_mesh`).

/// mimalloc: less time in allocation and contention than the system allocator under load.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    assay_mesh::standalone::main(assay_mesh::Stage::Refiners)
}
