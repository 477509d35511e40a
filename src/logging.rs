//! `AppLogLayer`: a `tracing` layer that filters, formats and files each event by
//! the logging config of the deployment and application it belongs to (the
//! deployment's own, else the application's, else the global one).
//!
//! An event belongs to the application (deployment) named by its `app`
//! (`deployment`) field, or by that field of the innermost span around it that
//! has one. Request access logs are events with target [`ACCESS_TARGET`] or one
//! under it (the HTTP proxy's); they are dropped where `enable_access_log` is
//! off. A config with `logs_dir` writes
//! its lines to `<logs_dir>/<application>.log` (appended, the directory created)
//! instead of the layer's writer (at most 256 such files open at once: the least
//! recently written is closed to open another); `additional_log_standard_attrs` adds Ray's
//! standard attributes that have an equivalent to every line. A line logged
//! inside a span naming a `request_id` or `route` (the HTTP proxy's, around
//! the ingress and every call it makes) carries them, as Ray's lines do. In
//! JSON, numbers and booleans are written as such, and each key once. Every
//! line carries its time as Ray's `asctime` (`2026-12-08 01:28:49,053`), in
//! UTC where Ray's is the host's local time: after the level in TEXT, as
//! `asctime` in JSON. A span's request fields may be recorded after it was
//! made (`span.record`).

use std::{
    borrow::Cow,
    collections::HashMap,
    fmt::Write as _,
    fs::File,
    io::Write as _,
    path::PathBuf,
    sync::Mutex,
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use flotilla_controller::LogSettings;
use flotilla_core::{AppName, LogAttr, LogEncoding, LogLevel, LoggingConfig};
use tracing::{
    Event, Level, Subscriber,
    field::{Field, Visit},
    span,
};
use tracing_subscriber::{Layer, fmt::MakeWriter, layer::Context, registry::LookupSpan};

pub use flotilla_replica::{ACCESS_TARGET, is_access_log};

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
    /// The files of `logs_dir` configs, opened once, at most
    /// [`MAX_OPEN_FILES`] at a time.
    files: Mutex<OpenFiles>,
    /// For `relativeCreated`: when the layer was made (log timestamps are wall
    /// clock by nature).
    started: Instant,
}

impl<W> AppLogLayer<W> {
    /// A layer reading `settings` and writing lines to `make_writer`.
    pub fn new(settings: LogSettings, make_writer: W) -> Self {
        AppLogLayer {
            settings,
            make_writer,
            files: Mutex::new(OpenFiles::default()),
            started: Instant::now(),
        }
    }

    /// Append `line` to `app`'s file under `dir`; `false` if it cannot be
    /// opened or written (the caller writes the line to the writer instead).
    fn write_file(&self, dir: &str, app: &str, line: &[u8]) -> bool {
        let path = PathBuf::from(dir).join(format!("{app}.log"));
        let mut files = self.files.lock().unwrap_or_else(|p| p.into_inner());
        files
            .get(path.clone(), || {
                std::fs::create_dir_all(dir).and_then(|()| {
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&path)
                })
            })
            .is_some_and(|f| f.write_all(line).is_ok())
    }
}

/// Most `logs_dir` files a layer keeps open. Applications come and go (each
/// name its own file): the least recently written is closed to open one
/// more, and opened again, to append, if it is written again.
const MAX_OPEN_FILES: usize = 256;

/// The open `logs_dir` files, each with when it was last written.
#[derive(Default)]
struct OpenFiles {
    files: HashMap<PathBuf, (File, u64)>,
    clock: u64,
}

impl OpenFiles {
    /// The file at `path`, opened by `open` if it is not open (closing the
    /// least recently written first when [`MAX_OPEN_FILES`] are); `None` if
    /// it cannot be opened.
    fn get(
        &mut self,
        path: PathBuf,
        open: impl FnOnce() -> std::io::Result<File>,
    ) -> Option<&mut File> {
        self.clock += 1;
        let now = self.clock;
        if !self.files.contains_key(&path) {
            // Closed first: near the descriptor limit, the open needs its slot.
            if self.files.len() >= MAX_OPEN_FILES
                && let Some(oldest) = (self.files.iter())
                    .min_by_key(|(_, (_, used))| *used)
                    .map(|(p, _)| p.clone())
            {
                self.files.remove(&oldest);
            }
            let file = open().ok()?;
            self.files.insert(path.clone(), (file, now));
        }
        let (file, used) = self.files.get_mut(&path)?;
        *used = now;
        Some(file)
    }
}

/// What a span tells the events inside it, stored in its extensions: the
/// application and deployment they belong to, and the request they serve
/// (Ray's `request_id` and `route` on every line logged while handling it).
#[derive(Default)]
struct SpanOwner {
    app: Option<String>,
    deployment: Option<String>,
    request: Vec<(&'static str, Value)>,
}

/// The span fields lines inside it carry ([`SpanOwner::request`]).
const REQUEST_FIELDS: [&str; 2] = ["request_id", "route"];

impl SpanOwner {
    /// What span fields `f` tell, if anything.
    fn of(f: Fields) -> Option<Self> {
        let request: Vec<(&'static str, Value)> = f
            .rest
            .into_iter()
            .filter(|(k, _)| REQUEST_FIELDS.contains(k))
            .collect();
        (f.app.is_some() || f.deployment.is_some() || !request.is_empty()).then_some(SpanOwner {
            app: f.app,
            deployment: f.deployment,
            request,
        })
    }

    /// Fields recorded later replace those recorded before.
    fn update(&mut self, later: SpanOwner) {
        if later.app.is_some() {
            self.app = later.app;
        }
        if later.deployment.is_some() {
            self.deployment = later.deployment;
        }
        for (k, v) in later.request {
            self.request.retain(|(had, _)| *had != k);
            self.request.push((k, v));
        }
    }
}

/// A field's value: text, or a number or boolean, written bare in JSON (as
/// Ray's `json.dumps` writes them).
#[derive(Clone)]
enum Value {
    Text(String),
    Literal(String),
}

impl Value {
    fn as_str(&self) -> &str {
        match self {
            Value::Text(s) | Value::Literal(s) => s,
        }
    }
}

#[derive(Default)]
struct Fields {
    app: Option<String>,
    deployment: Option<String>,
    message: String,
    rest: Vec<(&'static str, Value)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::Text(value.to_owned()));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::Literal(value.to_string()));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::Literal(value.to_string()));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        // JSON has no NaN or infinity: those are text.
        let v = if value.is_finite() {
            Value::Literal(format!("{value:?}"))
        } else {
            Value::Text(value.to_string())
        };
        self.put(field, v);
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::Literal(value.to_string()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, Value::Text(format!("{value:?}")));
    }
}

impl Fields {
    fn put(&mut self, field: &Field, value: Value) {
        match field.name() {
            "app" => self.app = Some(value.as_str().to_owned()),
            "deployment" => self.deployment = Some(value.as_str().to_owned()),
            "message" => self.message = value.as_str().to_owned(),
            name => self.rest.push((name, value)),
        }
    }

    /// Whether the event has a field `name` of its own.
    fn has(&self, name: &str) -> bool {
        self.rest.iter().any(|(k, _)| *k == name)
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

/// What an event is, for the standard attributes a config may add.
struct Origin {
    meta: &'static tracing::Metadata<'static>,
    /// Since the layer was made.
    relative: std::time::Duration,
    now: SystemTime,
}

/// `t` as Ray's `asctime` writes it (`2026-12-08 01:28:49,053`), in UTC.
fn asctime(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, day_secs) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's days-to-civil, for days since 1970-01-01.
    let z = days + 719_468;
    let (era, doe) = (z / 146_097, z % 146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02},{:03}",
        day_secs / 3_600,
        day_secs / 60 % 60,
        day_secs % 60,
        since.subsec_millis()
    )
}

/// The value of `attr` for an event, as Ray's log records name it (numbers
/// as numbers).
fn attr_value(attr: LogAttr, o: &Origin, f: &Fields) -> Value {
    let since_epoch = o.now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let level = o.meta.level();
    let text = |s: &str| Value::Text(s.to_owned());
    match attr {
        LogAttr::Asctime => Value::Text(asctime(o.now)),
        LogAttr::Created => Value::Literal(format!("{:.6}", since_epoch.as_secs_f64())),
        LogAttr::Msecs => Value::Literal(since_epoch.subsec_millis().to_string()),
        LogAttr::RelativeCreated => Value::Literal(o.relative.as_millis().to_string()),
        LogAttr::Filename => text(
            o.meta
                .file()
                .and_then(|p| p.rsplit('/').next())
                .unwrap_or(""),
        ),
        LogAttr::Pathname => text(o.meta.file().unwrap_or("")),
        LogAttr::Lineno => o
            .meta
            .line()
            .map_or(Value::Literal("null".to_owned()), |l| {
                Value::Literal(l.to_string())
            }),
        LogAttr::Module => text(o.meta.module_path().unwrap_or("")),
        LogAttr::Name => text(o.meta.target()),
        LogAttr::Levelname => text(ray_level(level)),
        LogAttr::Levelno => Value::Literal(ray_level_number(level).to_string()),
        LogAttr::Message => text(&f.message),
        LogAttr::Process => Value::Literal(std::process::id().to_string()),
        LogAttr::Thread => Value::Text(format!("{:?}", std::thread::current().id())),
        LogAttr::ThreadName => text(std::thread::current().name().unwrap_or("")),
    }
}

/// Python's level name for a tracing level.
fn ray_level(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "ERROR",
        Level::WARN => "WARNING",
        Level::INFO => "INFO",
        _ => "DEBUG",
    }
}

/// Python's level number for a tracing level.
fn ray_level_number(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 40,
        Level::WARN => 30,
        Level::INFO => 20,
        _ => 10,
    }
}

/// `each` of the [`SpanOwner`]s around `event`, innermost first.
fn each_owner<S>(ctx: &Context<'_, S>, event: &Event<'_>, mut each: impl FnMut(&SpanOwner))
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    for span in ctx.event_scope(event).into_iter().flatten() {
        if let Some(owner) = span.extensions().get::<SpanOwner>() {
            each(owner);
        }
    }
}

/// The keys every line starts with.
const LINE_KEYS: [&str; 6] = ["level", "asctime", "target", "app", "deployment", "message"];

/// One line: the line's own keys, then the event's fields, then the
/// attributes the config adds, each key once (a JSON object holds a key
/// once). An event field named as one of the line's own keys is written
/// as `field.<name>`, so an event's `level = "x"` cannot pass for the
/// line's level; an attribute the line has already (`message`, `asctime`)
/// is not written again.
fn format_line(config: &LoggingConfig, o: &Origin, f: &Fields) -> String {
    let (level, target) = (o.meta.level(), o.meta.target());
    let extra: Vec<(&'static str, Value)> = config
        .additional_log_standard_attrs
        .iter()
        .filter(|a| !LINE_KEYS.contains(&a.name()))
        .map(|a| (a.name(), attr_value(*a, o, f)))
        .collect();
    let mut more: Vec<(Cow<'static, str>, &Value)> = Vec::with_capacity(f.rest.len() + extra.len());
    for (k, v) in f.rest.iter().chain(&extra) {
        let key = if LINE_KEYS.contains(k) {
            Cow::Owned(format!("field.{k}"))
        } else {
            Cow::Borrowed(*k)
        };
        if !more.iter().any(|(written, _)| *written == key) {
            more.push((key, v));
        }
    }
    let mut line = String::with_capacity(128);
    let time = asctime(o.now);
    match config.encoding {
        LogEncoding::Text => {
            let _ = write!(line, "{level:>5} {time} {target}:");
            if let Some(app) = &f.app {
                let _ = write!(line, " app={app}");
            }
            if let Some(d) = &f.deployment {
                let _ = write!(line, " deployment={d}");
            }
            let _ = write!(line, " {}", f.message);
            for (k, v) in &more {
                let _ = write!(line, " {k}={}", v.as_str());
            }
        }
        LogEncoding::Json => {
            let _ = write!(
                line,
                "{{\"level\":\"{level}\",\"asctime\":\"{time}\",\"target\":"
            );
            json_escape(&mut line, target);
            if let Some(app) = &f.app {
                line.push_str(",\"app\":");
                json_escape(&mut line, app);
            }
            if let Some(d) = &f.deployment {
                line.push_str(",\"deployment\":");
                json_escape(&mut line, d);
            }
            line.push_str(",\"message\":");
            json_escape(&mut line, &f.message);
            for (k, v) in &more {
                line.push(',');
                json_escape(&mut line, k);
                line.push(':');
                match v {
                    Value::Text(s) => json_escape(&mut line, s),
                    Value::Literal(s) => line.push_str(s),
                }
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
        if let Some(owner) = SpanOwner::of(f)
            && let Some(span) = ctx.span(id)
        {
            span.extensions_mut().insert(owner);
        }
    }

    /// A span's fields recorded after it was made (`span.record`).
    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, ctx: Context<'_, S>) {
        let mut f = Fields::default();
        values.record(&mut f);
        if let Some(later) = SpanOwner::of(f)
            && let Some(span) = ctx.span(id)
        {
            let mut ext = span.extensions_mut();
            match ext.get_mut::<SpanOwner>() {
                Some(owner) => owner.update(later),
                None => ext.insert(later),
            }
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut f = Fields::default();
        event.record(&mut f);
        // Out from the innermost span, the first that names the application
        // (the deployment) gives it, unless the event names its own: what
        // picks the config.
        if f.app.is_none() || f.deployment.is_none() {
            each_owner(&ctx, event, |owner| {
                if f.app.is_none() {
                    f.app.clone_from(&owner.app);
                }
                if f.deployment.is_none() {
                    f.deployment.clone_from(&owner.deployment);
                }
            });
        }
        let config = self
            .settings
            .for_event(f.app.as_deref(), f.deployment.as_deref());
        let meta = event.metadata();
        if !allows(&config, meta.level()) {
            return;
        }
        if is_access_log(meta.target()) && !config.enable_access_log {
            return;
        }
        // The request it serves (`request_id`, `route`: the HTTP proxy's,
        // around the ingress and the calls it makes), the same way: copied
        // for a line that is written only, not for every event filtered out.
        each_owner(&ctx, event, |owner| {
            for (k, v) in &owner.request {
                if !f.has(k) {
                    f.rest.push((k, v.clone()));
                }
            }
        });
        let origin = Origin {
            meta,
            relative: self.started.elapsed(),
            now: SystemTime::now(),
        };
        let line = format_line(&config, &origin, &f);
        // Only an application's name names a file: an event from other code may
        // carry any `app` ("../x", "/tmp/x"), which must not reach a path.
        if let (Some(dir), Some(app)) = (&config.logs_dir, &f.app)
            && AppName::new(app.as_str()).is_ok()
            && self.write_file(dir, app, line.as_bytes())
        {
            return;
        }
        let _ = self.make_writer.make_writer().write_all(line.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

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

    /// Applications come and go, each name its own file: the layer keeps at
    /// most `MAX_OPEN_FILES` open (one per name ever seen before, until the
    /// process ran out of descriptors), and a file closed for another is
    /// opened again, appended to, when its application writes again.
    #[test]
    fn logs_dir_files_open_at_once_are_bounded_and_reopened_to_append() {
        let dir = tempfile::tempdir().unwrap();
        let logs = dir.path().join("logs").to_string_lossy().into_owned();
        let layer = AppLogLayer::new(LogSettings::new(), Buffer::default());
        let apps = MAX_OPEN_FILES + 44;
        for round in 0..2 {
            for i in 0..apps {
                assert!(layer.write_file(&logs, &format!("a{i}"), format!("{round}\n").as_bytes()));
                let open = layer.files.lock().unwrap().files.len();
                assert!(open <= MAX_OPEN_FILES, "{open} files open");
            }
        }
        for i in [0, apps / 2, apps - 1] {
            let text = std::fs::read_to_string(dir.path().join("logs").join(format!("a{i}.log")));
            assert_eq!(text.unwrap(), "0\n1\n", "a{i}");
        }
    }

    #[test]
    fn a_deployment_s_config_wins_and_logs_dir_and_attrs_apply() {
        let dir = tempfile::tempdir().unwrap();
        let settings = LogSettings::new();
        let spec = flotilla_core::ApplicationSpec::builder("shop")
            .logging(LoggingConfig {
                log_level: LogLevel::Warning,
                logs_dir: Some(dir.path().join("logs").to_string_lossy().into_owned()),
                ..Default::default()
            })
            .deployment(flotilla_core::DeploymentSpec::builder("front", "x::X"))
            .deployment(
                flotilla_core::DeploymentSpec::builder("back", "x::X").with_config(|c| {
                    c.with_logging(LoggingConfig {
                        log_level: LogLevel::Debug,
                        additional_log_standard_attrs: vec![LogAttr::Lineno, LogAttr::Name],
                        ..Default::default()
                    })
                }),
            )
            .build()
            .unwrap();
        settings.set_target(&spec);
        let buf = Buffer::default();
        let subscriber =
            tracing_subscriber::registry().with(AppLogLayer::new(settings, buf.clone()));
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(
                app = "shop",
                deployment = "front",
                "dropped: front is at WARNING"
            );
            let span = tracing::info_span!("reconcile", app = "shop", deployment = "back");
            let _g = span.enter();
            tracing::debug!("kept: back is at DEBUG, with its attributes");
            drop(_g);
            tracing::warn!(app = "shop", deployment = "front", "kept: into the file");
        });
        let got = lines(&buf);
        assert_eq!(got.len(), 1, "{got:#?}");
        assert!(got[0].contains("deployment=back"), "{}", got[0]);
        assert!(got[0].contains(" lineno="), "{}", got[0]);
        assert!(
            got[0].contains(" name=flotilla::logging::tests"),
            "{}",
            got[0]
        );
        let file = std::fs::read_to_string(dir.path().join("logs/shop.log")).unwrap();
        assert!(file.contains("kept: into the file"), "{file}");
        assert_eq!(file.lines().count(), 1);
    }

    #[test]
    fn an_app_field_that_is_no_application_name_names_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let logs = dir.path().join("logs");
        let settings = LogSettings::new();
        settings.set_global(LoggingConfig {
            logs_dir: Some(logs.to_string_lossy().into_owned()),
            ..Default::default()
        });
        let buf = Buffer::default();
        let subscriber =
            tracing_subscriber::registry().with(AppLogLayer::new(settings, buf.clone()));
        let outside = dir.path().join("evil.log");
        let absolute = dir.path().join("abs");
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(app = "../evil", "from other code");
            tracing::info!(app = %absolute.display(), "from other code");
            tracing::info!(app = "shop", "into shop.log");
        });
        assert!(!outside.exists(), "a file was written outside logs_dir");
        assert!(!dir.path().join("abs.log").exists());
        assert_eq!(lines(&buf).len(), 2, "both went to the writer");
        let file = std::fs::read_to_string(logs.join("shop.log")).unwrap();
        assert!(file.contains("into shop.log"), "{file}");
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
            tracing::info!(target: "flotilla::access::http", app = "verbose", "dropped: the proxy's too");
            let span = tracing::info_span!("reconcile", app = "verbose");
            let _g = span.enter();
            tracing::debug!("kept: the span names the app");
        });
        let got = lines(&buf);
        assert_eq!(got.len(), 3, "{got:#?}");
        assert!(got[0].starts_with("{\"level\":\"DEBUG\""), "{}", got[0]);
        assert!(got[0].contains("\"app\":\"verbose\""));
        assert!(got[0].contains("\"message\":\"kept \\\"quoted\\\"\""));
        assert!(got[0].contains("\"n\":1"));
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

    #[test]
    fn asctime_is_rays_format_in_utc() {
        let at = |ms: u64| UNIX_EPOCH + std::time::Duration::from_millis(ms);
        assert_eq!(asctime(at(0)), "1970-01-01 00:00:00,000");
        assert_eq!(asctime(at(1_796_693_329_053)), "2026-12-08 01:28:49,053");
        assert_eq!(asctime(at(951_782_400_500)), "2000-02-29 00:00:00,500");
        assert_eq!(asctime(at(4_102_444_799_999)), "2099-12-31 23:59:59,999");
    }

    /// JSON lines are objects a log pipeline reads as Ray's: each key once
    /// (an event's own `level` cannot pass for the line's: it was written
    /// twice, and a reader keeping the last took it), numbers and booleans
    /// as such (all were text), and the request a line serves (the HTTP
    /// proxy's span names it) on every line logged while serving it, nested
    /// spans included (none had it).
    #[test]
    fn json_lines_have_each_key_once_typed_values_and_their_request() {
        let settings = LogSettings::new();
        settings.set_global(LoggingConfig {
            encoding: LogEncoding::Json,
            additional_log_standard_attrs: vec![
                LogAttr::Message,
                LogAttr::Lineno,
                LogAttr::Asctime,
            ],
            ..Default::default()
        });
        let buf = Buffer::default();
        let subscriber =
            tracing_subscriber::registry().with(AppLogLayer::new(settings, buf.clone()));
        tracing::subscriber::with_default(subscriber, || {
            let request = tracing::info_span!(
                "http_request",
                app = "shop",
                deployment = "ingress",
                route = "/shop",
                request_id = tracing::field::Empty
            );
            // Recorded after the span was made.
            request.record("request_id", "r-1");
            let _r = request.enter();
            let call = tracing::info_span!("replica_call", replica = 3);
            let _c = call.enter();
            tracing::info!(level = "mine", n = 2, ok = true, x = 1.5, "user code");
            tracing::info!(request_id = "own", "its own id");
        });
        let got = lines(&buf);
        assert_eq!(got.len(), 2, "{got:#?}");
        for key in ["level", "asctime", "message", "lineno"] {
            assert_eq!(
                got[0].matches(&format!("\"{key}\":")).count(),
                1,
                "{}",
                got[0]
            );
        }
        let v: serde_json::Value = serde_json::from_str(&got[0]).unwrap();
        assert_eq!(v["field.level"], "mine", "kept, renamed");
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["message"], "user code");
        assert_eq!(
            v["asctime"].as_str().map(str::len),
            Some(23),
            "every line has its time"
        );
        assert_eq!(
            (&v["n"], &v["ok"], &v["x"]),
            (&2.into(), &true.into(), &1.5.into())
        );
        assert!(v["lineno"].is_u64(), "{v}");
        assert_eq!(
            (&v["app"], &v["deployment"]),
            (&"shop".into(), &"ingress".into())
        );
        assert_eq!(
            (&v["request_id"], &v["route"]),
            (&"r-1".into(), &"/shop".into())
        );
        let v: serde_json::Value = serde_json::from_str(&got[1]).unwrap();
        assert_eq!(v["request_id"], "own", "the event's own wins");
    }
}
