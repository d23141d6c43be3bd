// Compiles the client protocol (proto/apache/rocketmq/v2), the admin protocol
// (proto/ledgermq/admin.proto) and the name server protocol
// (proto/ledgermq/namesrv.proto) with the pure-Rust protox compiler, so
// `cargo build` needs no protoc from apt.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(
        [
            "apache/rocketmq/v2/definition.proto",
            "apache/rocketmq/v2/service.proto",
            "ledgermq/admin.proto",
            "ledgermq/namesrv.proto",
        ],
        ["proto"],
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
