//! The peer systems' server processes for `mqbench-compare`, started on loopback
//! and stopped (process groups killed) when dropped: a 3-node NATS JetStream
//! cluster ([`nats::NatsCluster`]) and a 3-node RabbitMQ cluster
//! ([`rabbit::RabbitCluster`]). Both use Debian's packages (`nats-server`,
//! `rabbitmq-server`). The LedgerMQ group is `ledgermq_testkit::cluster::LocalCluster`.

pub mod nats;
pub mod proc;
pub mod rabbit;
