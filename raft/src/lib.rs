//! LedgerMQ's Raft layer (openraft): a broker group is a three-node Raft group whose
//! replicated log is the store's CommitLog; applying a committed entry dispatches it
//! into the ConsumeQueues. Filled by issue 3; nothing here yet.
