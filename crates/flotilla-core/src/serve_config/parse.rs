//! Reading a [`ServeConfig`] from YAML text, with line and column in every error.
//!
//! The YAML crate is `serde-saphyr`: pure Rust, `unsafe` forbidden, fuzzed and
//! documented not to panic on malformed input, with resource budgets (nesting depth,
//! node count, alias expansion) on by default, and a position on every error.

use std::{cell::Cell, fmt};

use serde::{
    Deserialize, Deserializer,
    de::{IgnoredAny, MapAccess, SeqAccess, Visitor},
};
use serde_saphyr::{Options, Spanned};

use super::{ServeConfig, Site, suggest};
use crate::error::{Error, shown, shown_up_to};

impl ServeConfig {
    /// Parse and validate a config file's text (see [`ServeConfig`] for the format).
    /// Nothing is read from disk: the caller reads the file.
    ///
    /// A malformed file (bad YAML, an unknown field, a wrong type) is
    /// [`Error::Parse`] with the line and column; an unknown field's message names
    /// the nearest known field, and Ray's old single-application format (a
    /// top-level `import_path`) says to wrap it under `applications:`. A
    /// well-formed file with a bad value
    /// (see [`validate`](Self::validate)) is [`Error::InConfig`], the line and column
    /// of the value around an error that names the application, the deployment and
    /// the field.
    ///
    /// ```
    /// use flotilla_core::{Error, ServeConfig};
    ///
    /// let config = ServeConfig::from_yaml(
    ///     "applications:\n  - name: shop\n    import_path: shop:app\n    args: {n: 3}\n",
    /// )
    /// .unwrap();
    /// assert_eq!(config.applications[0].name.as_str(), "shop");
    /// #[derive(serde::Deserialize)]
    /// struct ShopArgs { n: u32 }
    /// assert_eq!(config.applications[0].args.decode::<ShopArgs>().unwrap().n, 3);
    ///
    /// let typo = ServeConfig::from_yaml("applications:\n  - name: shop\n    improt_path: x\n");
    /// assert!(matches!(typo, Err(Error::Parse { line: 3, .. })));
    /// ```
    pub fn from_yaml(text: &str) -> Result<ServeConfig, Error> {
        let _wide = super::wide_ints::watch();
        let config: ServeConfig = match serde_saphyr::from_str_with_options(text, options()) {
            Ok(c) => c,
            Err(e) => {
                return Err(single_app_format(text).unwrap_or_else(|| parse_error(e, text)));
            }
        };
        if let Some(e) = super::wide_ints::too_wide(text) {
            return Err(e);
        }
        if let Err(sited) = config.check() {
            let (error, site) = *sited;
            // Parse again, this time keeping every node's position, to find the
            // offending value. The text parsed once already, so this parses too.
            return Err(match tree(text).and_then(|t| locate(&t, site)) {
                Some((line, column)) => Error::InConfig {
                    line,
                    column,
                    error: Box::new(error),
                },
                None => error,
            });
        }
        Ok(config)
    }
}

/// Strict YAML 1.2 booleans (`yes`, `on`, `y` are text, so `y:` is not the key
/// `true`), duplicate keys rejected, plain messages (the position is ours to report).
/// `.inf` and `.nan` are read as floats wherever a value is read typeless, as
/// PyYAML reads them: each field decides (a float field's range check; `args`
/// refuses them, see [`super::value`]). A plain `0` followed by octal digits is
/// octal (`010` is 8), as in YAML 1.1: the same file means the same numbers to
/// Ray and to Flotilla.
fn options() -> Options {
    serde_saphyr::options! {
        strict_booleans: true,
        legacy_octal_numbers: true,
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::Error,
        with_snippet: false,
        non_finite_float_policy: serde_saphyr::NonFiniteFloatPolicy::PassThrough,
    }
}

/// The parse error `e` of `text`; a value's error (out of range, the wrong
/// type) is prefixed with the path of the field that holds it, since the
/// reader's own message does not name it.
fn parse_error(e: serde_saphyr::Error, text: &str) -> Error {
    if let Some(breach) = budget_breach(&e) {
        let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
        return Error::Parse {
            line,
            column,
            message: too_much(breach),
        };
    }
    let plain = e.without_snippet().to_string();
    let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
    let suffix = format!(" at line {line}, column {column}");
    let message = plain.strip_suffix(&suffix).unwrap_or(&plain);
    let message = suggest::unknown_field(message).unwrap_or_else(|| message.to_owned());
    let message = match tree(text).and_then(|t| path_at(&t, (line, column))) {
        Some(path) => format!("`{path}`: {message}"),
        None => message,
    };
    Error::Parse {
        line,
        column,
        message: quoted_bounded(&message),
    }
}

/// The budget `e` breached, if it is (or wraps) a breach.
fn budget_breach(e: &serde_saphyr::Error) -> Option<&serde_saphyr::budget::BudgetBreach> {
    match e {
        serde_saphyr::Error::Budget { breach, .. } => Some(breach),
        serde_saphyr::Error::AliasError { error, .. }
        | serde_saphyr::Error::WithSnippet { error, .. } => budget_breach(error),
        _ => None,
    }
}

/// What a breach of the YAML reader's budgets means, in a config's terms
/// (the reader words it as its own `Debug` text). Aliases count each time
/// they are used, so a small text can break them: an "alias bomb".
fn too_much(breach: &serde_saphyr::budget::BudgetBreach) -> String {
    use serde_saphyr::budget::BudgetBreach as B;
    let expanded = "counting every use of an alias (*name) in full";
    match breach {
        B::Events { events } => {
            format!("the config is too large to read: over {events} YAML events, {expanded}")
        }
        B::Nodes { nodes } => {
            format!("the config is too large to read: over {nodes} YAML values, {expanded}")
        }
        B::Aliases { aliases } => format!("too many aliases (*name): over {aliases}"),
        B::Anchors { anchors } => format!("too many anchors (&name): over {anchors}"),
        B::Depth { depth } => format!("YAML nested too deep (over {depth} levels)"),
        B::Documents { documents } => {
            format!("{documents} YAML documents: a config is one document")
        }
        B::ScalarBytes { total_scalar_bytes } => {
            format!("the config's values are too large to read: over {total_scalar_bytes} bytes")
        }
        B::MergeKeys { merge_keys } => format!("too many merge keys (<<): over {merge_keys}"),
        B::AliasAnchorRatio { aliases, anchors } => format!(
            "too many uses of aliases ({aliases}) for the anchors they name ({anchors}): an \
             alias bomb?"
        ),
        _ => "the config is too large or too deeply nested to read".to_owned(),
    }
}

/// The longest parse error message, in bytes: a few quoted values and the
/// list of what was expected.
const MAX_MESSAGE: usize = 1_000;

/// `message` with every quoted part (between backticks, or double quotes)
/// cut as [`shown`] cuts a value, then the whole cut at [`MAX_MESSAGE`]: the
/// YAML reader quotes the offending value whole (an unknown variant, an
/// invalid string), a value may be megabytes long, and one holding the quote
/// marks themselves is not cut by the first step.
fn quoted_bounded(message: &str) -> String {
    let quoted = ['`', '"'].iter().fold(message.to_owned(), |m, q| {
        m.split(*q)
            .enumerate()
            .map(|(i, part)| {
                if i % 2 == 1 {
                    shown(part)
                } else {
                    part.to_owned()
                }
            })
            .collect::<Vec<_>>()
            .join(&q.to_string())
    });
    shown_up_to(&quoted, MAX_MESSAGE)
}

/// The document's shape with every node's position, if it is YAML at all.
fn tree(text: &str) -> Option<Spanned<Node>> {
    DEPTH.set(0);
    serde_saphyr::from_str_with_options::<Spanned<Node>>(text, options()).ok()
}

/// Ray's single-application format (a top-level `import_path` and no
/// `applications`): the error saying how to migrate, at the `import_path`. Only
/// the top level is read (its values are skipped), so a hostile document costs
/// no more here than in the parse that failed.
fn single_app_format(text: &str) -> Option<Error> {
    struct TopKeys(Vec<(Option<String>, Spanned<IgnoredAny>)>);
    impl<'de> Deserialize<'de> for TopKeys {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = TopKeys;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("a mapping")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<TopKeys, A::Error> {
                    let mut keys = Vec::new();
                    while let Some((Key(k), v)) = a.next_entry()? {
                        keys.push((k, v));
                    }
                    Ok(TopKeys(keys))
                }
            }
            d.deserialize_map(V)
        }
    }
    let top = serde_saphyr::from_str_with_options::<TopKeys>(text, options()).ok()?;
    let has = |k: &str| top.0.iter().find(|(key, _)| key.as_deref() == Some(k));
    if has("applications").is_some() {
        return None;
    }
    let (_, at) = has("import_path")?;
    Some(Error::Parse {
        line: at.referenced.line(),
        column: at.referenced.column(),
        message: suggest::SINGLE_APP.to_owned(),
    })
}

/// The position of the value `site` names: the field if the file has it, else the
/// nearest enclosing node that it has.
fn locate(root: &Spanned<Node>, site: Site) -> Option<(u64, u64)> {
    let mut node = root;
    let mut path: Vec<Step<'_>> = Vec::with_capacity(8);
    if let Some(i) = site.app {
        path.extend([Step::Key("applications"), Step::Index(i)]);
    }
    if let Some(j) = site.deployment {
        path.extend([Step::Key("deployments"), Step::Index(j)]);
    }
    if let Some(field) = site.field {
        path.extend(field.split('.').map(Step::Key));
    }
    for step in path {
        let next = match (&node.value, step) {
            (Node::Map(entries), Step::Key(k)) => entries
                .iter()
                .find(|(key, _)| key.as_deref() == Some(k))
                .map(|(_, v)| v),
            (Node::Seq(items), Step::Index(i)) => items.get(i),
            _ => None,
        };
        match next {
            Some(n) => node = n,
            None => break,
        }
    }
    let at = node.referenced;
    (at.line() > 0).then(|| (at.line(), at.column()))
}

/// The path (`applications[0].deployments[1].max_ongoing_requests`) of the
/// outermost value that starts at `at`, if one does: the inverse of [`locate`].
/// Two values start at one place only inside an alias, where the reader puts
/// every node (and an error in it) at the alias: the field that holds the
/// alias is the one named.
fn path_at(root: &Spanned<Node>, at: (u64, u64)) -> Option<String> {
    fn walk(node: &Spanned<Node>, at: (u64, u64), path: &mut String) -> bool {
        match &node.value {
            Node::Leaf => false,
            Node::Seq(items) => (items.iter().enumerate())
                .any(|(i, child)| enter(child, at, path, &format!("[{i}]"))),
            Node::Map(entries) => entries.iter().any(|(key, child)| {
                key.as_deref().is_some_and(|k| {
                    let dot = if path.is_empty() { "" } else { "." };
                    enter(child, at, path, &format!("{dot}{}", shown(k)))
                })
            }),
        }
    }
    fn enter(child: &Spanned<Node>, at: (u64, u64), path: &mut String, step: &str) -> bool {
        let len = path.len();
        path.push_str(step);
        let here = (child.referenced.line(), child.referenced.column()) == at;
        if here || walk(child, at, path) {
            return true;
        }
        path.truncate(len);
        false
    }
    let mut path = String::new();
    (at.0 > 0 && walk(root, at, &mut path)).then_some(path)
}

#[derive(Clone, Copy)]
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

/// A YAML document's shape with the position of every node, and nothing else.
enum Node {
    Leaf,
    Seq(Vec<Spanned<Node>>),
    /// Keys that are not text are kept as `None`: no field is named by them.
    Map(Vec<(Option<String>, Spanned<Node>)>),
}

/// How deep [`tree`] keeps the shape: below this a node is a [`Node::Leaf`].
/// Every field a site names (`applications[i].deployments[j].ray_actor_options
/// .resources.x`) is within 7 levels; a free-form value (`args`) may nest as
/// deep as the reader allows (64), and a `Spanned` node per level costs so much
/// stack that 60 levels overflowed a 2 MiB thread in a debug build.
const SHAPE_DEPTH: usize = 10;

thread_local! {
    /// The nesting depth of the [`Node`] being read on this thread: serde gives a
    /// `Deserialize` no place to carry it through `Spanned`.
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let depth = DEPTH.get();
        if depth >= SHAPE_DEPTH {
            IgnoredAny::deserialize(d)?;
            return Ok(Node::Leaf);
        }
        DEPTH.set(depth + 1);
        let node = d.deserialize_any(NodeVisitor);
        DEPTH.set(depth);
        node
    }
}

struct NodeVisitor;

macro_rules! leaf {
    ($($name:ident: $ty:ty),*) => {
        $(fn $name<E: serde::de::Error>(self, _: $ty) -> Result<Node, E> {
            Ok(Node::Leaf)
        })*
    };
}

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML node")
    }

    leaf!(visit_bool: bool, visit_i64: i64, visit_u64: u64, visit_i128: i128,
          visit_u128: u128, visit_f64: f64, visit_str: &str, visit_bytes: &[u8]);

    fn visit_unit<E: serde::de::Error>(self) -> Result<Node, E> {
        Ok(Node::Leaf)
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Node, E> {
        Ok(Node::Leaf)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = a.next_element()? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some((Key(k), v)) = a.next_entry()? {
            entries.push((k, v));
        }
        Ok(Node::Map(entries))
    }
}

/// A map key: its text if it is a string.
struct Key(Option<String>);

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        macro_rules! other {
            ($($name:ident: $ty:ty),*) => {
                $(fn $name<E: serde::de::Error>(self, _: $ty) -> Result<Key, E> {
                    Ok(Key(None))
                })*
            };
        }
        impl<'de> Visitor<'de> for V {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping key")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Key, E> {
                Ok(Key(Some(v.to_owned())))
            }
            other!(visit_bool: bool, visit_i64: i64, visit_u64: u64, visit_i128: i128,
                   visit_u128: u128, visit_f64: f64, visit_bytes: &[u8]);
            fn visit_unit<E: serde::de::Error>(self) -> Result<Key, E> {
                Ok(Key(None))
            }
            fn visit_none<E: serde::de::Error>(self) -> Result<Key, E> {
                Ok(Key(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Key, A::Error> {
                while a.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Key(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Key, A::Error> {
                while a.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Key(None))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde::Deserialize;

    use super::*;
    use crate::{
        AppConfig, Args, AutoscalingOverride, DeploymentOverride, LogEncoding, LogLevel,
        LoggingConfig, Nullable, NumReplicas, RayActorOptions,
    };

    #[test]
    fn a_huge_offending_value_is_quoted_short() {
        let huge = "x".repeat(100_000);
        for text in [
            format!("proxy_location: {huge}\napplications: []\n"),
            format!(
                "proxy_location: {}\napplications: []\n",
                "x`".repeat(50_000)
            ),
            format!(
                "http_options: {{host: [\"{}\"]}}\napplications: []\n",
                "x\\\"".repeat(30_000)
            ),
            format!("http_options: {{port: \"{huge}\"}}\napplications: []\n"),
            format!(
                "applications:\n  - name: a\n    import_path: x\n    deployments:\n      - \
                 name: d\n        max_ongoing_requests: \"{huge}\"\n"
            ),
            format!(
                "applications:\n  - name: a\n    import_path: x\n    deployments:\n      - \
                 name: d\n        placement_group_bundles: [{{CPU: 1}}]\n        \
                 ray_actor_options: {{resources: {{{huge}: 1}}}}\n"
            ),
        ] {
            let err = ServeConfig::from_yaml(&text)
                .and_then(|c| c.validate().map(|()| c))
                .map(|_| ())
                .unwrap_err();
            let message = err.to_string();
            assert!(
                message.len() < 1_200,
                "{} bytes: {}",
                message.len(),
                &message[..300]
            );
        }
    }

    const FULL: &str = r#"
logging_config:
  log_level: WARNING
  encoding: JSON
  enable_access_log: false
applications:
  - name: app1
    route_prefix: /app1
    import_path: shop.builders:app
    args: {greeting: hello, n: 3}
    logging_config: {log_level: DEBUG}
    take_over: true
    deployments:
      - name: front
        autoscaling_config:
          min_replicas: 1
          max_replicas: 5
          target_ongoing_requests: 2
          upscale_delay_s: 30
          downscale_delay_s: 600
          upscaling_factor: 1.0
          downscaling_factor: 0.5
          look_back_period_s: 30
          initial_replicas: 2
        max_ongoing_requests: 5
        max_queued_requests: -1
        user_config: {any: yaml, list: [1, 2.5, true, null]}
        health_check_period_s: 10
        health_check_timeout_s: 30
        graceful_shutdown_wait_loop_s: 2
        graceful_shutdown_timeout_s: 20.5
        ray_actor_options: {num_cpus: 1, num_gpus: 0, memory: 0, resources: {custom: 1}}
      - name: back
        num_replicas: 3
        max_queued_requests: 7
  - name: app2
    route_prefix: /app2
    import_path: other:app
"#;

    fn parse(text: &str) -> ServeConfig {
        match ServeConfig::from_yaml(text) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        }
    }

    fn err(text: &str) -> Error {
        ServeConfig::from_yaml(text).expect_err("the config should be rejected")
    }

    fn apps(body: &str) -> String {
        format!("applications:\n{body}")
    }

    #[test]
    fn full_example_parses_with_every_field() {
        let c = parse(FULL);
        assert_eq!(
            c.logging_config,
            Some(LoggingConfig {
                log_level: LogLevel::Warning,
                encoding: LogEncoding::Json,
                enable_access_log: false,
                ..LoggingConfig::default()
            })
        );
        assert_eq!(c.applications.len(), 2);
        let a = &c.applications[0];
        assert_eq!(a.name.as_str(), "app1");
        assert_eq!(a.route_prefix.prefix().map(|p| p.as_str()), Some("/app1"));
        assert_eq!(a.import_path.as_str(), "shop.builders:app");
        #[derive(Deserialize, PartialEq, Debug)]
        struct Greet {
            greeting: String,
            n: u32,
        }
        assert_eq!(
            a.args.decode::<Greet>().unwrap(),
            Greet {
                greeting: "hello".into(),
                n: 3
            }
        );
        // A partial logging config takes Ray's defaults for the rest.
        assert_eq!(
            a.logging_config,
            Some(LoggingConfig {
                log_level: LogLevel::Debug,
                ..LoggingConfig::default()
            })
        );
        assert!(a.take_over);
        let front = &a.deployments[0];
        assert_eq!(
            front,
            &DeploymentOverride {
                name: "front".try_into().unwrap(),
                num_replicas: None,
                autoscaling_config: Nullable::Set(AutoscalingOverride {
                    min_replicas: Some(1),
                    max_replicas: Some(5),
                    initial_replicas: Some(2),
                    target_ongoing_requests: Some(2.0),
                    upscale_delay_s: Some(30.0),
                    downscale_delay_s: Some(600.0),
                    upscaling_factor: Some(1.0),
                    downscaling_factor: Some(0.5),
                    look_back_period_s: Some(30.0),
                    ..AutoscalingOverride::default()
                }),
                max_ongoing_requests: Some(5),
                max_queued_requests: Some(-1),
                user_config: Nullable::Set(Args::encode(&serde_json_like::user_config()).unwrap()),
                health_check_period_s: Some(10.0),
                health_check_timeout_s: Some(30.0),
                graceful_shutdown_wait_loop_s: Some(2.0),
                graceful_shutdown_timeout_s: Some(20.5),
                ray_actor_options: Some(RayActorOptions {
                    num_cpus: Some(1.0),
                    num_gpus: Some(0.0),
                    memory: Some(0),
                    resources: Some([("custom".to_owned(), 1.0)].into()),
                    ..RayActorOptions::default()
                }),
                ..DeploymentOverride::new("front".try_into().unwrap())
            }
        );
        let back = &a.deployments[1];
        assert_eq!(back.num_replicas, Some(NumReplicas::Fixed(3)));
        assert_eq!(back.max_queued_requests, Some(7));
        assert_eq!(back.user_config, Nullable::Keep);
        let b = &c.applications[1];
        // Missing optional fields take their defaults.
        assert_eq!(b.route_prefix.prefix().map(|p| p.as_str()), Some("/app2"));
        assert_eq!(b.args, Args::encode(&serde_json_like::empty_map()).unwrap());
        assert_eq!(b.logging_config, None);
        assert!(!b.take_over);
        assert!(b.deployments.is_empty());
    }

    /// Values built by hand, in canonical (key-sorted) order.
    mod serde_json_like {
        use std::collections::BTreeMap;

        use serde::Serialize;

        #[derive(Serialize)]
        #[serde(untagged)]
        pub(super) enum V {
            S(&'static str),
            L(Vec<Item>),
        }

        #[derive(Serialize)]
        #[serde(untagged)]
        pub(super) enum Item {
            I(u64),
            F(f64),
            B(bool),
            N(Option<()>),
        }

        pub(super) fn user_config() -> BTreeMap<&'static str, V> {
            BTreeMap::from([
                ("any", V::S("yaml")),
                (
                    "list",
                    V::L(vec![Item::I(1), Item::F(2.5), Item::B(true), Item::N(None)]),
                ),
            ])
        }

        pub(super) fn empty_map() -> BTreeMap<String, u8> {
            BTreeMap::new()
        }
    }

    #[test]
    fn the_example_file_parses() {
        let c = parse(include_str!("../../../../examples/serve_config.yaml"));
        let names: Vec<&str> = c.applications.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["greeter", "shop", "admin"]);
        let shop = c.application("shop").unwrap();
        assert_eq!(shop.deployments.len(), 2);
        assert_eq!(
            shop.deployment("pricing").unwrap().max_queued_requests,
            Some(-1)
        );
        assert!(c.application("admin").unwrap().take_over);
        assert_eq!(
            c.application("greeter").unwrap().deployments[0].num_replicas,
            Some(NumReplicas::Auto)
        );
    }

    #[test]
    fn a_bad_indent_reports_its_line_and_column() {
        // Line 4 is indented less than the mapping it continues.
        let text = "applications:\n  - name: a\n    import_path: x:y\n   route_prefix: /a\n";
        match err(text) {
            Error::Parse {
                line,
                column,
                message,
            } => {
                assert_eq!((line, column), (4, 4), "{message}");
                assert!(!message.contains("at line"), "{message}");
            }
            other => panic!("unexpected {other}"),
        }
        // A tab where YAML wants spaces, and an unclosed flow map.
        let tab = err("applications:\n  - name: a\n\timport_path: x\n");
        assert!(
            matches!(&tab, Error::Parse { line: 2.., message, .. } if message.contains("tab")),
            "{tab}"
        );
        let open = err("applications:\n  - name: a\n    import_path: x\n    args: {a: 1\n");
        assert!(matches!(open, Error::Parse { line: 4.., .. }), "{open}");
    }

    #[test]
    fn unknown_fields_are_rejected_by_name_at_every_level() {
        // Each a true typo of a field Ray's schema has at that level: the error
        // names it and suggests the field meant.
        let cases = [
            (
                "http_option: {}\napplications: []\n",
                "http_option",
                1,
                "http_options",
            ),
            (
                "logging_config: {log_levle: INFO}\napplications: []\n",
                "log_levle",
                1,
                "log_level",
            ),
            (
                &apps("  - name: a\n    import_path: x\n    runtime_envs: {}\n"),
                "runtime_envs",
                4,
                "runtime_env",
            ),
            (
                &apps(
                    "  - name: a\n    import_path: x\n    deployments:\n      - name: d\n        num_replica: 2\n",
                ),
                "num_replica",
                6,
                "num_replicas",
            ),
            (
                &apps(
                    "  - name: a\n    import_path: x\n    deployments:\n      - name: d\n        autoscaling_config: {metrics_interval: 1}\n",
                ),
                "metrics_interval",
                6,
                "metrics_interval_s",
            ),
            (
                &apps(
                    "  - name: a\n    import_path: x\n    deployments:\n      - name: d\n        ray_actor_options:\n          num_cpu: 1\n",
                ),
                "num_cpu",
                7,
                "num_cpus",
            ),
        ];
        for (text, field, line, meant) in cases {
            match err(text) {
                Error::Parse {
                    line: l, message, ..
                } => {
                    assert!(message.contains(field), "{field}: {message}");
                    assert!(message.contains("unknown field"), "{message}");
                    assert!(
                        message.ends_with(&format!("did you mean `{meant}`?")),
                        "{field}: {message}"
                    );
                    assert_eq!(l, line, "{field}: {message}");
                }
                other => panic!("{field}: unexpected {other}"),
            }
        }
    }

    #[test]
    fn wrong_types_and_missing_fields_are_parse_errors() {
        let missing = err("applications:\n  - name: a\n");
        assert!(
            matches!(&missing, Error::Parse { message, .. } if message.contains("import_path")),
            "{missing}"
        );
        let no_apps = err("logging_config: {}\n");
        assert!(matches!(no_apps, Error::Parse { .. }), "{no_apps}");
        let empty = err("");
        assert!(matches!(empty, Error::Parse { .. }), "{empty}");
        let level = err("logging_config: {log_level: LOUD}\napplications: []\n");
        assert!(matches!(level, Error::Parse { line: 1, .. }), "{level}");
        let count = err(&apps(
            "  - name: a\n    import_path: x\n    deployments:\n      - name: d\n        max_ongoing_requests: many\n",
        ));
        assert!(matches!(count, Error::Parse { line: 6, .. }), "{count}");
        let two_docs = err("applications: []\n---\napplications: []\n");
        assert!(matches!(two_docs, Error::Parse { .. }), "{two_docs}");
        let dup_key = err("applications: []\napplications: []\n");
        assert!(matches!(dup_key, Error::Parse { line: 2, .. }), "{dup_key}");
    }

    #[test]
    fn invalid_names_prefixes_and_import_paths_are_rejected_with_their_position() {
        for (body, line, what) in [
            ("  - name: a b\n    import_path: x\n", 2, "application name"),
            ("  - name: a\n    import_path: x y\n", 3, "import path"),
            (
                "  - name: a\n    import_path: x\n    route_prefix: /a?b\n",
                4,
                "route prefix",
            ),
            (
                "  - name: a\n    import_path: x\n    deployments:\n      - name: ''\n",
                5,
                "deployment name",
            ),
        ] {
            match err(&apps(body)) {
                Error::Parse {
                    line: l, message, ..
                } => {
                    assert_eq!(l, line, "{message}");
                    assert!(message.contains(what), "{message}");
                }
                other => panic!("unexpected {other}"),
            }
        }
    }

    #[test]
    fn yaml_1_1_booleans_are_text() {
        let c = parse(&apps(
            "  - name: a\n    import_path: x\n    args: {y: yes, n: on}\n",
        ));
        let args: std::collections::BTreeMap<String, String> =
            c.applications[0].args.decode().unwrap();
        assert_eq!(args["y"], "yes");
        assert_eq!(args["n"], "on");
        let e = err(&apps(
            "  - name: a\n    import_path: x\n    take_over: yes\n",
        ));
        assert!(matches!(e, Error::Parse { line: 4, .. }), "{e}");
    }

    #[test]
    fn fixed_num_replicas_with_autoscaling_config_is_rejected_at_its_line() {
        let text = apps(
            "  - name: a\n    import_path: x\n    deployments:\n      - name: d\n        num_replicas: 3\n        autoscaling_config: {max_replicas: 4}\n",
        );
        let e = err(&text);
        assert_eq!(e.position(), Some((6, 23)), "{e}");
        assert_eq!(e.app(), Some("a"));
        assert_eq!(e.deployment(), Some("d"));
        assert_eq!(e.field_name(), Some("num_replicas"));
        assert!(e.to_string().contains("config line 6"), "{e}");
        // "auto" with an autoscaling config is Ray's way to tune the "auto" defaults.
        let ok = parse(&text.replace("num_replicas: 3", "num_replicas: auto"));
        assert_eq!(
            ok.applications[0].deployments[0].num_replicas,
            Some(NumReplicas::Auto)
        );
    }

    #[test]
    fn num_replicas_is_a_count_or_auto() {
        let with = |v: &str| {
            ServeConfig::from_yaml(&apps(&format!(
                "  - name: a\n    import_path: x\n    deployments:\n      - name: d\n        num_replicas: {v}\n"
            )))
            .map(|c| c.applications[0].deployments[0].num_replicas)
        };
        assert_eq!(with("auto").unwrap(), Some(NumReplicas::Auto));
        assert_eq!(with("0").unwrap(), Some(NumReplicas::Fixed(0)));
        assert_eq!(with("12").unwrap(), Some(NumReplicas::Fixed(12)));
        assert_eq!(with("~").unwrap(), None);
        for bad in ["-1", "AUTO", "1.5", "99999999999", "[1]"] {
            let e = with(bad).unwrap_err();
            assert!(matches!(e, Error::Parse { line: 6, .. }), "{bad}: {e}");
        }
    }

    #[test]
    fn max_queued_requests_minus_one_is_unbounded_and_zero_is_rejected() {
        let with = |v: &str| {
            ServeConfig::from_yaml(&apps(&format!(
                "  - name: a\n    import_path: x\n    deployments:\n      - name: d\n        max_queued_requests: {v}\n"
            )))
        };
        assert_eq!(
            with("-1").unwrap().applications[0].deployments[0].max_queued_requests,
            Some(-1)
        );
        for bad in ["0", "-2", "5000000000"] {
            let e = with(bad).unwrap_err();
            assert_eq!(e.field_name(), Some("max_queued_requests"), "{bad}: {e}");
            assert_eq!(e.position(), Some((6, 30)), "{bad}: {e}");
        }
    }

    #[test]
    fn duplicate_application_names_are_rejected() {
        let e = err(&apps(
            "  - name: a\n    import_path: x\n  - name: b\n    import_path: x\n  - name: a\n    import_path: y\n",
        ));
        assert_eq!(e.app(), Some("a"));
        assert_eq!(e.field_name(), Some("name"));
        assert_eq!(e.position(), Some((6, 11)), "{e}");
        assert!(e.to_string().contains("appears twice"), "{e}");
    }

    #[test]
    fn route_prefixes_are_validated_as_ray_does_never_rewritten() {
        for bad in ["api", "/api/", "/{x}"] {
            let e = err(&apps(&format!(
                "  - name: a\n    import_path: x\n    route_prefix: \"{bad}\"\n"
            )));
            assert_eq!(e.position().map(|p| p.0), Some(4), "{bad}: {e}");
            assert!(e.to_string().contains("route prefix"), "{bad}: {e}");
        }
    }

    #[test]
    fn duplicate_route_prefixes_are_rejected() {
        let e = err(&apps(
            "  - name: a\n    import_path: x\n    route_prefix: /api\n  - name: b\n    import_path: x\n    route_prefix: /api\n",
        ));
        assert_eq!(e.app(), Some("b"));
        assert_eq!(e.field_name(), Some("route_prefix"));
        assert_eq!(e.position().map(|p| p.0), Some(7), "{e}");
        assert!(
            e.to_string().contains("also used by application 'a'"),
            "{e}"
        );
        // Applications without a prefix do not collide.
        parse(&apps(
            "  - name: a\n    import_path: x\n  - name: b\n    import_path: x\n",
        ));
    }

    #[test]
    fn duplicate_deployment_overrides_are_rejected() {
        let e = err(&apps(
            "  - name: a\n    import_path: x\n    deployments:\n      - name: d\n      - name: d\n",
        ));
        assert_eq!((e.app(), e.deployment()), (Some("a"), Some("d")));
        assert_eq!(e.field_name(), Some("name"));
        assert_eq!(e.position(), Some((6, 15)), "{e}");
    }

    #[test]
    fn out_of_range_values_name_application_deployment_field_and_line() {
        let cases = [
            ("max_ongoing_requests: 0", "max_ongoing_requests"),
            ("health_check_period_s: 0", "health_check_period_s"),
            ("health_check_timeout_s: -1", "health_check_timeout_s"),
            (
                "graceful_shutdown_wait_loop_s: .nan",
                "graceful_shutdown_wait_loop_s",
            ),
            (
                "graceful_shutdown_timeout_s: 1e300",
                "graceful_shutdown_timeout_s",
            ),
            (
                "ray_actor_options: {num_cpus: -1}",
                "ray_actor_options.num_cpus",
            ),
            (
                "ray_actor_options: {num_gpus: .inf}",
                "ray_actor_options.num_gpus",
            ),
            (
                "autoscaling_config: {min_replicas: 3, max_replicas: 2}",
                "autoscaling_config.min_replicas",
            ),
            (
                "autoscaling_config: {max_replicas: 0, min_replicas: 0}",
                "autoscaling_config.max_replicas",
            ),
            (
                "autoscaling_config: {max_replicas: 4, initial_replicas: 5}",
                "autoscaling_config.initial_replicas",
            ),
            (
                "autoscaling_config: {target_ongoing_requests: 0}",
                "autoscaling_config.target_ongoing_requests",
            ),
            (
                "autoscaling_config: {upscaling_factor: -1}",
                "autoscaling_config.upscaling_factor",
            ),
            (
                "autoscaling_config: {look_back_period_s: 0}",
                "autoscaling_config.look_back_period_s",
            ),
            (
                "autoscaling_config: {downscale_delay_s: -5}",
                "autoscaling_config.downscale_delay_s",
            ),
        ];
        for (line, field) in cases {
            let text = apps(&format!(
                "  - name: shop\n    import_path: x\n    deployments:\n      - name: front\n        {line}\n"
            ));
            let e = err(&text);
            assert_eq!(e.field_name(), Some(field), "{line}: {e}");
            assert_eq!(e.app(), Some("shop"), "{line}: {e}");
            assert_eq!(e.deployment(), Some("front"), "{line}: {e}");
            assert_eq!(e.position().map(|p| p.0), Some(6), "{line}: {e}");
            let shown = e.to_string();
            assert!(
                shown.contains("application 'shop', deployment 'front'") && shown.contains(field),
                "{shown}"
            );
        }
    }

    #[test]
    fn the_same_text_gives_the_same_bytes_and_key_order_does_not_matter() {
        let one = apps("  - name: a\n    import_path: x\n    args: {b: 1, a: {d: [1, 2], c: x}}\n");
        let two = apps(
            "  - name: a\n    import_path: x\n    args:\n      a:\n        c: x\n        d: [0x1, 2]\n      b: 1\n",
        );
        let a1 = parse(&one).applications[0].args.clone();
        assert_eq!(a1, parse(&one).applications[0].args);
        assert_eq!(a1, parse(&two).applications[0].args);
        let other =
            apps("  - name: a\n    import_path: x\n    args: {b: 2, a: {d: [1, 2], c: x}}\n");
        assert_ne!(a1, parse(&other).applications[0].args);
    }

    #[test]
    fn null_optional_fields_are_left_out() {
        let c = parse(&apps(
            "  - name: a\n    import_path: x\n    route_prefix: null\n    logging_config: ~\n    deployments:\n      - name: d\n        user_config: null\n        max_ongoing_requests: ~\n",
        ));
        let a = &c.applications[0];
        assert_eq!(
            a.route_prefix,
            crate::RouteOverride::Off,
            "null removes the route"
        );
        assert_eq!(a.logging_config, None);
        // Except where Ray gives null a meaning (see `Nullable`).
        let mut d = DeploymentOverride::new("d".try_into().unwrap());
        d.user_config = Nullable::Clear;
        assert_eq!(a.deployments[0], d);
        let none = parse(&apps("  - name: a\n    import_path: x\n    deployments:\n"));
        assert!(none.applications[0].deployments.is_empty());
    }

    #[test]
    fn hostile_inputs_are_errors_not_panics() {
        let deep = format!(
            "applications:\n  - name: a\n    import_path: x\n    args: {}{}\n",
            "[".repeat(100),
            "]".repeat(100)
        );
        assert!(matches!(err(&deep), Error::Parse { .. }));
        let laughs = "a: &a [x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e]\napplications:\n  - name: z\n    import_path: x\n    args: [*f, *f, *f, *f, *f, *f, *f, *f]\n";
        assert!(ServeConfig::from_yaml(laughs).is_err());
        let mut bomb = "applications:\n  - name: z\n    import_path: x\n    args:\n      a: &a [x, x, x, x, x, x, x, x, x, x]\n".to_owned();
        for (name, prev) in [
            ("b", "a"),
            ("c", "b"),
            ("d", "c"),
            ("e", "d"),
            ("f", "e"),
            ("g", "f"),
        ] {
            let uses = vec![format!("*{prev}"); 10].join(", ");
            bomb.push_str(&format!("      {name}: &{name} [{uses}]\n"));
        }
        let e = ServeConfig::from_yaml(&bomb).unwrap_err().to_string();
        assert!(
            e.contains("too large to read") && e.contains("alias") && !e.contains("{"),
            "said in a config's terms, not the reader's Debug text: {e}"
        );
        let e = err(&deep).to_string();
        assert!(e.contains("nested too deep"), "{e}");
        for text in [
            "\u{0}",
            "applications: [",
            "applications: {",
            "applications: *nothing",
            "? [a]\n: b",
            "applications:\n  - !!binary x",
            "%YAML 9.9\n---\napplications: []",
            "applications:\n  - name: a\n    import_path: x\n    args: \"\\ud800\"\n",
            // Too wide for 64 bits: read as a float, it would change.
            "applications: [{name: a, import_path: x, args: 99999999999999999999999}]",
        ] {
            assert!(ServeConfig::from_yaml(text).is_err(), "{text:?}");
        }
        // Odd but harmless: parsed, not panicked on.
        assert!(ServeConfig::from_yaml("\u{feff}applications: []").is_ok());
    }

    #[test]
    fn round_trips_through_msgpack() {
        // Named, as the checkpoint stores it: a field left out (a route
        // prefix, a deployment's `user_config`) is left out of the encoding
        // too, which a positional one cannot express.
        let c = parse(FULL);
        let bytes = rmp_serde::to_vec_named(&c).unwrap();
        let back: ServeConfig = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(back, c);
        // A config built in code round-trips too, named, as the checkpoint
        // stores it: its left-out route prefix is left out of the encoding
        // too, which a positional one cannot express.
        let mut app = AppConfig::new("x".try_into().unwrap(), "b:app".try_into().unwrap());
        app.args = Args::encode(&("tuple", 1)).unwrap();
        let by_hand = ServeConfig::new(vec![app]);
        let bytes = rmp_serde::to_vec_named(&by_hand).unwrap();
        assert_eq!(
            rmp_serde::from_slice::<ServeConfig>(&bytes).unwrap(),
            by_hand
        );
    }

    #[test]
    fn durations_may_be_fractions_of_seconds() {
        let c = parse(&apps(
            "  - name: a\n    import_path: x\n    deployments:\n      - name: d\n        health_check_period_s: 0.25\n",
        ));
        let d = &c.applications[0].deployments[0];
        let config = d.apply_to(crate::DeploymentConfig::default()).unwrap();
        assert_eq!(config.health_check_period, Duration::from_millis(250));
    }
}
