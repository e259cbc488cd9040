//! Generates the `strata.peer.v1` messages and service from the proto (protoc comes from
//! Debian's `protobuf-compiler`). `bytes` fields map to `bytes::Bytes`, so a block is
//! sliced into chunks, not copied, on both sides.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tonic_prost_build::configure()
        .bytes(".")
        .compile_protos(&["proto/strata/peer/v1/peer.proto"], &["proto"])?;
    Ok(())
}
