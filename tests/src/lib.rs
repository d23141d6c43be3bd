//! Workspace-level integration tests live in `tests/tests/`; they start the project's
//! real binaries as separate processes. This library holds what they share with the
//! demo programs: [`cluster`], a local cluster of real processes (from
//! [`ledgermq_testkit`], the kit every harness shares), [`clocks`], one
//! whose node clocks a test can move, [`netns`], a network namespace with its own
//! hosts file, [`compose`], deploy/compose's containers, [`python`], which runs a
//! check script of the official Python client, [`grpc`], a one-call 5.x producer,
//! and [`remoting`], a blocking 4.x
//! remoting client.

#![deny(missing_docs)]
pub mod clocks;
pub mod compose;
pub mod grpc;
pub use ledgermq_testkit::cluster;
pub mod netns;
pub mod python;
pub mod remoting;
