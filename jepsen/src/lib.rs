//! LedgerMQ's Jepsen-style partition tests: test hosts in network namespaces, nemesis,
//! workload, checkers and report. Filled by issue 6; nothing here yet.
