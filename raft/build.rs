// Compiles proto/raft_peer.proto with the pure-Rust protox compiler, so building
// needs no protoc from apt.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/raft_peer.proto");
    let fds = protox::compile(["raft_peer.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
