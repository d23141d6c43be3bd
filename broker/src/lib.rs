//! LedgerMQ's broker node: the RocketMQ 5 gRPC client protocol, consumer groups,
//! FIFO, heartbeats to name servers and the `mqbroker` binary. Filled by issue 5;
//! nothing here yet.
