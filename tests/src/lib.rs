//! Workspace-level integration tests live in `tests/tests/`; they start the project's
//! real binaries as separate processes. This library is empty on purpose.
