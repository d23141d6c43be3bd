pub mod error;
pub mod mapped_file;
pub mod record;
