// Compiles proto/namesrv.proto with the pure-Rust protox compiler (no apt protoc).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/namesrv.proto");
    let fds = protox::compile(["namesrv.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
