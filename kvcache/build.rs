//! Generates the `strata.kv.v1` messages and service from the proto (protoc comes from
//! Debian's `protobuf-compiler`). `bytes` fields map to `bytes::Bytes` so block chunks
//! are sliced, not copied, on both sides.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tonic_prost_build::configure()
        .bytes(".")
        .compile_protos(&["proto/strata/kv/v1/kv.proto"], &["proto"])?;
    Ok(())
}
