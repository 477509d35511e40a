//! `AppLogLayer`: a `tracing` layer that filters and formats each event by the
//! logging config of the application it belongs to (its own, else the global one).
//!
//! An event belongs to the application named by its `app` field, or by the `app`
//! field of the innermost span around it that has one. Request access logs are
//! events with target [`ACCESS_TARGET`]; they are dropped where
//! `enable_access_log` is off.

use std::{fmt::Write as _, io::Write as _};

use flotilla_controller::LogSettings;
use flotilla_core::{LogEncoding, LogLevel, LoggingConfig};
use tracing::{
    Event, Level, Subscriber,
    field::{Field, Visit},
    span,
};
use tracing_subscriber::{Layer, fmt::MakeWriter, layer::Context, registry::LookupSpan};

pub use flotilla_replica::ACCESS_TARGET;

/// Filters and formats events by their application's [`LoggingConfig`].
///
/// ```no_run
/// use tracing_subscriber::layer::SubscriberExt;
/// let options = flotilla::ServeOptions::new(flotilla::Registry::new());
/// let layer = flotilla::AppLogLayer::new(options.logging.clone(), std::io::stderr);
/// tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer)).unwrap();
/// ```
pub struct AppLogLayer<W> {
    settings: LogSettings,
    make_writer: W,
}

impl<W> AppLogLayer<W> {
    /// A layer reading `settings` and writing lines to `make_writer`.
    pub fn new(settings: LogSettings, make_writer: W) -> Self {
        AppLogLayer {
            settings,
            make_writer,
        }
    }
}

/// The application a span belongs to, stored in its extensions.
struct SpanApp(String);

#[derive(Default)]
struct Fields {
    app: Option<String>,
    message: String,
    rest: Vec<(&'static str, String)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, format!("{value:?}"));
    }
}

impl Fields {
    fn put(&mut self, field: &Field, value: String) {
        match field.name() {
            "app" => self.app = Some(value),
            "message" => self.message = value,
            name => self.rest.push((name, value)),
        }
    }
}

fn allows(config: &LoggingConfig, level: &Level) -> bool {
    let min = match config.log_level {
        // Python's NOTSET filters nothing; tracing has no level above ERROR.
        LogLevel::NotSet => Level::TRACE,
        LogLevel::Debug => Level::DEBUG,
        LogLevel::Info => Level::INFO,
        LogLevel::Warning => Level::WARN,
        LogLevel::Error | LogLevel::Critical => Level::ERROR,
    };
    // tracing orders levels by verbosity: ERROR < WARN < INFO < DEBUG < TRACE.
    *level <= min
}

fn json_escape(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn format_line(encoding: LogEncoding, level: &Level, target: &str, f: &Fields) -> String {
    let mut line = String::with_capacity(128);
    match encoding {
        LogEncoding::Text => {
            let _ = write!(line, "{level:>5} {target}:");
            if let Some(app) = &f.app {
                let _ = write!(line, " app={app}");
            }
            let _ = write!(line, " {}", f.message);
            for (k, v) in &f.rest {
                let _ = write!(line, " {k}={v}");
            }
        }
        LogEncoding::Json => {
            let _ = write!(line, "{{\"level\":\"{level}\",\"target\":");
            json_escape(&mut line, target);
            if let Some(app) = &f.app {
                line.push_str(",\"app\":");
                json_escape(&mut line, app);
            }
            line.push_str(",\"message\":");
            json_escape(&mut line, &f.message);
            for (k, v) in &f.rest {
                line.push(',');
                json_escape(&mut line, k);
                line.push(':');
                json_escape(&mut line, v);
            }
            line.push('}');
        }
    }
    line.push('\n');
    line
}

impl<S, W> Layer<S> for AppLogLayer<W>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + 'static,
{
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        let mut f = Fields::default();
        attrs.record(&mut f);
        if let (Some(app), Some(span)) = (f.app, ctx.span(id)) {
            span.extensions_mut().insert(SpanApp(app));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut f = Fields::default();
        event.record(&mut f);
        if f.app.is_none()
            && let Some(scope) = ctx.event_scope(event)
        {
            f.app = scope
                .from_root()
                .filter_map(|s| s.extensions().get::<SpanApp>().map(|a| a.0.clone()))
                .last();
        }
        let config = self.settings.for_app(f.app.as_deref());
        let meta = event.metadata();
        if !allows(&config, meta.level()) {
            return;
        }
        if meta.target() == ACCESS_TARGET && !config.enable_access_log {
            return;
        }
        let line = format_line(config.encoding, meta.level(), meta.target(), &f);
        let _ = self.make_writer.make_writer().write_all(line.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use flotilla_core::AppName;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'a self) -> Buffer {
            self.clone()
        }
    }

    fn lines(b: &Buffer) -> Vec<String> {
        String::from_utf8(b.0.lock().unwrap().clone())
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn each_application_is_filtered_and_formatted_by_its_own_config() {
        let settings = LogSettings::new();
        settings.set_global(LoggingConfig {
            log_level: LogLevel::Warning,
            ..Default::default()
        });
        settings.set_app(
            &AppName::new("verbose").unwrap(),
            Some(LoggingConfig {
                log_level: LogLevel::Debug,
                encoding: LogEncoding::Json,
                enable_access_log: false,
                ..Default::default()
            }),
        );
        let buf = Buffer::default();
        let subscriber =
            tracing_subscriber::registry().with(AppLogLayer::new(settings, buf.clone()));
        tracing::subscriber::with_default(subscriber, || {
            tracing::debug!(app = "verbose", n = 1, "kept \"quoted\"");
            tracing::info!(app = "quiet", "dropped: below the global WARNING");
            tracing::warn!(app = "quiet", "kept as text");
            tracing::info!(target: "flotilla::access", app = "verbose", "dropped: access log off");
            let span = tracing::info_span!("reconcile", app = "verbose");
            let _g = span.enter();
            tracing::debug!("kept: the span names the app");
        });
        let got = lines(&buf);
        assert_eq!(got.len(), 3, "{got:#?}");
        assert!(got[0].starts_with("{\"level\":\"DEBUG\""), "{}", got[0]);
        assert!(got[0].contains("\"app\":\"verbose\""));
        assert!(got[0].contains("\"message\":\"kept \\\"quoted\\\"\""));
        assert!(got[0].contains("\"n\":\"1\""));
        assert!(
            got[1].contains(" WARN ") || got[1].starts_with(" WARN"),
            "{}",
            got[1]
        );
        assert!(got[1].contains("app=quiet kept as text"), "{}", got[1]);
        assert!(
            got[2].contains("\"message\":\"kept: the span names the app\""),
            "{}",
            got[2]
        );
    }
}
