//! `tracing` setup: logs go to stderr as text or JSON lines; `RUST_LOG` filters.

use std::io::Write;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global subscriber (once; later calls are ignored).
pub fn init(format: Format) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // No colours: the writer escapes every escape sequence, the ones colours need too.
    let builder =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(SafeStderr).with_target(false).with_ansi(false);
    let _ = match format {
        Format::Text => builder.try_init(),
        Format::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Standard error for log lines, through [`SafeLine`].
struct SafeStderr;

impl<'a> MakeWriter<'a> for SafeStderr {
    type Writer = SafeLine;

    fn make_writer(&'a self) -> SafeLine {
        SafeLine
    }
}

/// Writes each log event (one `write` per event) to stderr with every character that must
/// not reach a terminal raw escaped ([`crate::error::printable`]), a message's own line
/// breaks too; only the line's final newline is kept.
struct SafeLine;

impl Write for SafeLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let (body, newline) = match text.strip_suffix('\n') {
            Some(b) => (b, "\n"),
            None => (&*text, ""),
        };
        let line = format!("{}{newline}", kata_addons_facts::Escaped(body));
        std::io::stderr().lock().write_all(line.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}
