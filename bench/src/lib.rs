//! LedgerMQ benchmarks (issue 7).
//!
//! - `mqbench`: a load tool for any LedgerMQ cluster over the RocketMQ 5 gRPC
//!   protocol or the 4.x remoting protocol ([`remoting`], `--protocol
//!   remoting`), in the spirit of RocketMQ's benchmark producer and consumer.
//! - `mqbench-compare`: the same load, in one run on one machine, against a local
//!   LedgerMQ 3-node group (SYNC_FLUSH and ASYNC_FLUSH, over gRPC and over
//!   remoting), a 3-node NATS JetStream
//!   cluster (file storage, replicas 3) and a 3-node RabbitMQ cluster (quorum
//!   queue), all on loopback; prints a table and the ratios.
//! - `mqbench-noop`: a MessagingService that stores nothing ([`noop`]), or with
//!   `--protocol remoting` a 4.x remoting server that stores nothing
//!   ([`noop_remoting`]), to measure what the transport alone costs on a machine.
//!
//! Every system is driven by the same [`runner`] (windowed producers, consumers,
//! progress, summary) through a [`runner::Driver`]: [`ledgermq::LedgerMq`],
//! [`remoting::LedgerMqRemoting`], [`nats::Nats`], [`rabbit::Rabbit`]. The peers' server processes are started and
//! stopped by [`peers`].

#![deny(missing_docs)]
pub mod compare;
pub mod ledgermq;
pub mod nats;
pub mod noop;
pub mod noop_remoting;
pub mod payload;
pub mod peers;
pub mod rabbit;
pub mod remoting;
pub mod runner;
pub mod stats;
pub mod summary;
pub mod table;
