//! LedgerMQ's name server: the route registry brokers register with and clients query,
//! and the `mqnamesrv` binary. Filled by issue 4; nothing here yet.
