//! Where the workspace's binaries are: `LEDGERMQ_BIN_DIR` if set, else next to the
//! running executable, or one directory up (test executables live in `deps/`).
//! Build them first with `cargo build --bins` (`scripts/test` does).

use std::path::PathBuf;

use crate::KitError;

/// The path of workspace binary `name` (see the module docs). Error:
/// [`KitError::BinaryNotFound`] naming the directories searched.
pub fn bin(name: &str) -> Result<PathBuf, KitError> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("LEDGERMQ_BIN_DIR") {
        dirs.push(PathBuf::from(d));
    }
    let exe = std::env::current_exe().map_err(KitError::io("finding the running executable"))?;
    if let Some(d) = exe.parent() {
        dirs.push(d.to_path_buf());
        if let Some(up) = d.parent() {
            dirs.push(up.to_path_buf());
        }
    }
    dirs.iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| KitError::BinaryNotFound {
            name: name.to_owned(),
            searched: dirs.clone(),
        })
}
