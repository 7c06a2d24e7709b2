//! Compiles the Talos API subset in `proto/` into Rust (prost messages, tonic client and server
//! stubs) with `protox`, a protobuf compiler written in Rust: no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/machine/machine.proto",
        "proto/machine/lifecycle.proto",
        "proto/machine/image.proto",
        "proto/cluster/cluster.proto",
    ];
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        // The server stubs serve the Talos API service of the integration tests.
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
