//! Compiles `ps/v1/*.proto` with protox (pure Rust, no system `protoc`) and
//! generates tonic code into `OUT_DIR`, with every `bytes` field as `bytes::Bytes`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "ps/v1/ps.proto",
        "ps/v1/bench.proto",
        "ps/v1/scheduler.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["."])?;
    tonic_prost_build::configure()
        .bytes(".")
        .compile_fds(descriptors)?;
    Ok(())
}
