//! Process logging for `mqnamesrv` and `mqbroker`: every event is one line on
//! stdout, as text (tracing's `fmt` format) or as a JSON object
//! (`--log-format json`: `timestamp`, `level`, `target` and the event's fields,
//! `message` among them, at the top level). Terminal colour codes are written
//! only when stdout is a terminal and `NO_COLOR` (<https://no-color.org>) is
//! unset or empty, so a log redirected to a file or a collector is plain.
//! `RUST_LOG` picks what is logged, else the binary's default filter.

use std::ffi::OsStr;
use std::io::IsTerminal;

/// How log events are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable text, one line per event.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    /// `text` or `json` (any case). Error: anything else, named.
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            _ => Err(format!("log format {s:?}: expected text or json")),
        }
    }
}

/// Whether log lines may carry terminal colour codes: only text, to a
/// terminal, with `no_color` (the `NO_COLOR` variable) unset or empty.
pub fn use_colour(format: LogFormat, is_terminal: bool, no_color: Option<&OsStr>) -> bool {
    format == LogFormat::Text && is_terminal && no_color.is_none_or(OsStr::is_empty)
}

/// Installs the process's global subscriber, writing to stdout in `format`;
/// `default_filter` (an `EnvFilter` directive such as `info,openraft=warn`)
/// applies unless `RUST_LOG` is set. Does nothing if a subscriber is already
/// installed.
pub fn init(format: LogFormat, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| default_filter.into());
    let ansi = use_colour(
        format,
        std::io::stdout().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_for_text_on_a_terminal_without_no_color() {
        assert!(use_colour(LogFormat::Text, true, None));
        assert!(use_colour(LogFormat::Text, true, Some(OsStr::new(""))));
        assert!(!use_colour(LogFormat::Text, false, None));
        assert!(!use_colour(LogFormat::Text, true, Some(OsStr::new("1"))));
        assert!(!use_colour(LogFormat::Json, true, None));
    }

    #[test]
    fn formats_parse_by_name() {
        assert_eq!("json".parse(), Ok(LogFormat::Json));
        assert_eq!("TEXT".parse(), Ok(LogFormat::Text));
        assert!("yaml".parse::<LogFormat>().unwrap_err().contains("yaml"));
    }
}
