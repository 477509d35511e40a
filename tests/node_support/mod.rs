//! Support for the node tests: a deployment that says where it runs, node
//! processes of this test binary (started and killed by the tests), and waits
//! on events instead of sleeps.

#![allow(dead_code, clippy::unwrap_used)]

use std::{
    io::{BufRead, BufReader, Write},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use flotilla::{
    ApplicationSpec, Cookie, Deployment, DeploymentSpec, HeadOptions, InitContext, Registry,
    Resources, Serve, ServeOptions, UserError,
};
use futures::{Stream, stream};
use serde::{Deserialize, Serialize};

/// The node tests share two cores: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long one node test may run before its watchdog ends the test binary.
const TEST_LIMIT: Duration = Duration::from_secs(180);

/// A node test's turn: the tests in a binary run one at a time, and a
/// watchdog ends the whole binary (exit code 101) if this one is still running
/// after [`TEST_LIMIT`], so that a hang fails the run, naming the test, instead
/// of holding it until the CI's own limit. Its node processes exit with it
/// (their stdin closes).
pub struct Turn {
    _turn: tokio::sync::MutexGuard<'static, ()>,
    _running: std::sync::mpsc::Sender<()>,
}

/// Wait for the calling test's turn, and watch it. Call it first, on the
/// test's own thread (the harness names it after the test; a `#[tokio::test]`
/// body runs there).
pub async fn turn() -> Turn {
    let test = std::thread::current()
        .name()
        .unwrap_or("a node test")
        .to_owned();
    let turn = ONE_AT_A_TIME.lock().await;
    let (running, done) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = done.recv_timeout(TEST_LIMIT) {
            // Past the harness's output capture, which dies with the process.
            if let Ok(mut err) = std::fs::OpenOptions::new().write(true).open("/dev/stderr") {
                let _ = writeln!(
                    err,
                    "{test}: still running after {TEST_LIMIT:?}, a hang: ending the test binary"
                );
            }
            std::process::exit(101);
        }
    });
    Turn {
        _turn: turn,
        _running: running,
    }
}

/// Start the calling test: wait for its [`turn`], then start its head with
/// `resources` on loopback, port 0, in a fresh directory (the head's store
/// and the node processes' logs). Returns the turn, the directory, the head
/// and its node address.
pub async fn setup(resources: Resources) -> (Turn, tempfile::TempDir, Serve, SocketAddr) {
    let turn = turn().await;
    let dir = tempfile::tempdir().unwrap();
    let serve = head(dir.path(), resources).await;
    let addr = serve.node_address().unwrap();
    (turn, dir, serve, addr)
}

/// A node process `name` offering one `gpu` (a custom resource) and no CPUs.
pub fn gpu_node(name: &str) -> NodeSpec {
    NodeSpec::new(name, 0.0).custom("gpu", 1.0)
}

/// The cookie every test process shares.
pub const COOKIE: &str = "flotilla-test-cookie";
/// The variable a node child listening off loopback reads its cookie from.
const CHILD_COOKIE_ENV: &str = "FLOTILLA_TEST_NODE_COOKIE";
/// Set (to a config line) to make `node_child` act as a node process.
pub const CHILD_ENV: &str = "FLOTILLA_NODE_CHILD";
/// Where a node process's `AppLogLayer` writes (by the logging settings its
/// head sends it).
pub const APPLOG_ENV: &str = "FLOTILLA_NODE_APPLOG";

/// What a `Where` replica answers: where it ran, and what it was asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Here {
    /// The node it runs on.
    pub node: String,
    /// Its replica id.
    pub replica: u64,
    /// Its tag (init args).
    pub tag: String,
    /// The request.
    pub echo: String,
    /// What its downstream answered, if it has one.
    pub downstream: Option<Box<Here>>,
    /// Requests running on this replica when this one began (itself included).
    pub concurrent: u32,
}

/// `Where`'s init args.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WhereArgs {
    /// Changes the code version.
    pub tag: String,
    /// Call this deployment of the same application and nest its answer.
    pub downstream: Option<String>,
    /// The application `downstream` is in, when not this one.
    #[serde(default)]
    pub downstream_app: Option<String>,
    /// Sleep this long per request.
    pub delay_ms: u64,
}

/// Says where it runs.
pub struct Where {
    node: String,
    replica: u64,
    args: WhereArgs,
    downstream: Option<flotilla::DeploymentHandle>,
    in_flight: std::sync::atomic::AtomicU32,
}

impl Deployment for Where {
    type Request = String;
    type Response = Here;

    async fn handle(&self, echo: String) -> Result<Here, UserError> {
        use std::sync::atomic::Ordering;
        let concurrent = self.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        let mut done = Done {
            in_flight: &self.in_flight,
            cancelled: None,
        };
        if let Some(marker) = echo.strip_prefix("log:") {
            // User code logging with no fields of its own.
            tracing::info!(marker, "user code logs");
        }
        if self.args.delay_ms > 0 {
            // What a test waits for (in the node's log) to know it runs, and
            // (if it is dropped in its sleep) that it was cancelled.
            tracing::info!("where: request {echo} began");
            done.cancelled = Some(echo.clone());
            tokio::time::sleep(Duration::from_millis(self.args.delay_ms)).await;
            done.cancelled = None;
        }
        let downstream = match &self.downstream {
            Some(h) => Some(Box::new(
                h.call::<_, Here>(&echo)
                    .await
                    .map_err(|e| UserError::new(e.to_string()))?,
            )),
            None => None,
        };
        Ok(Here {
            node: self.node.clone(),
            replica: self.replica,
            tag: self.args.tag.clone(),
            echo,
            downstream,
            concurrent,
        })
    }

    fn handle_stream(
        &self,
        echo: String,
    ) -> impl Stream<Item = Result<Here, UserError>> + Send + '_ {
        let items: Vec<Result<Here, UserError>> = (0..3)
            .map(|i| {
                Ok(Here {
                    node: self.node.clone(),
                    replica: self.replica,
                    tag: self.args.tag.clone(),
                    echo: format!("{echo}#{i}"),
                    downstream: None,
                    concurrent: 0,
                })
            })
            .collect();
        stream::iter(items)
    }
}

/// Counts a request out however it ends; one dropped while `cancelled` names
/// it says so in the node's log, once it is counted out.
struct Done<'a> {
    in_flight: &'a std::sync::atomic::AtomicU32,
    cancelled: Option<String>,
}

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.in_flight
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        if let Some(echo) = &self.cancelled {
            tracing::info!("where: request {echo} cancelled");
        }
    }
}

/// A multiplexed deployment: its models are named by id and know the node
/// that loaded them.
pub struct Models {
    node: String,
}

impl flotilla::MultiplexedDeployment for Models {
    type Request = String;
    /// "model <id> on <node>: <request>"
    type Response = String;
    type Model = String;

    /// Fails for an id that starts with "broken".
    async fn load_model(&self, model_id: &str) -> Result<String, UserError> {
        if model_id.starts_with("broken") {
            return Err(UserError::new(format!("no model {model_id} here")));
        }
        Ok(format!("model {model_id} on {}", self.node))
    }

    async fn handle(&self, model: &String, request: String) -> Result<String, UserError> {
        Ok(format!("{model}: {request}"))
    }
}

/// What a [`ModelCaller`] is asked.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum CallerRequest {
    /// Call `models` for `model` and answer what it answered.
    Call { model: String, request: String },
    /// Answer the node of a replica that this caller's process sees holding
    /// `model` (waits until it sees one, by subscription to the replicas'
    /// model ids).
    Holder { model: String },
}

impl CallerRequest {
    /// Call for `model` with the request "x".
    pub fn call(model: &str) -> Self {
        CallerRequest::Call {
            model: model.to_owned(),
            request: "x".to_owned(),
        }
    }

    /// Ask who holds `model`.
    pub fn holder(model: &str) -> Self {
        CallerRequest::Holder {
            model: model.to_owned(),
        }
    }
}

/// A [`ModelCaller`] deployment, `caller`, on the node that offers a `caller`
/// (a custom resource).
pub fn caller_dep() -> flotilla::DeploymentSpecBuilder {
    DeploymentSpec::builder("caller", "where::ModelCaller")
        .with_config(|c| c.with_resources(Resources::none().with_custom("caller", 1.0)))
}

/// Calls the `models` deployment of its application with a model id: a
/// handle in the process it runs in.
pub struct ModelCaller {
    models: flotilla::DeploymentHandle,
}

impl Deployment for ModelCaller {
    type Request = CallerRequest;
    type Response = String;

    async fn handle(&self, request: CallerRequest) -> Result<String, UserError> {
        let failed = |e: &dyn std::fmt::Display| UserError::new(e.to_string());
        match request {
            CallerRequest::Call { model, request } => self
                .models
                .clone()
                .with_model_id(&model)
                .map_err(|e| failed(&e))?
                .call::<_, String>(&request)
                .await
                .map_err(|e| failed(&e)),
            CallerRequest::Holder { model } => {
                let mut waits: futures::stream::FuturesUnordered<_> = self
                    .models
                    .replicas()
                    .iter()
                    .filter_map(|e| Some((e.node().to_owned(), e.watch_models()?)))
                    .map(|(node, mut ids)| {
                        let model = model.clone();
                        async move {
                            ids.wait_for(|m| m.loaded.iter().any(|id| **id == *model))
                                .await
                                .ok()?;
                            Some(node)
                        }
                    })
                    .collect();
                while let Some(seen) = futures::StreamExt::next(&mut waits).await {
                    if let Some(node) = seen {
                        return Ok(node);
                    }
                }
                Err(UserError::new(format!("no replica here holds {model}")))
            }
        }
    }
}

/// A batched deployment that says how its requests were served.
pub struct Batched;

impl Deployment for Batched {
    type Request = String;
    /// "<request> alone", or "<request> in a batch of <n>".
    type Response = String;
    const BATCHED: bool = true;

    async fn handle(&self, request: String) -> Result<String, UserError> {
        Ok(format!("{request} alone"))
    }

    async fn handle_batch(&self, requests: Vec<String>) -> Result<Vec<String>, UserError> {
        let n = requests.len();
        Ok(requests
            .into_iter()
            .map(|r| format!("{r} in a batch of {n}"))
            .collect())
    }
}

/// A multiplexed deployment that answers how many models its replica holds.
#[derive(Default)]
pub struct Counted {
    loaded: std::sync::atomic::AtomicU32,
}

impl flotilla::MultiplexedDeployment for Counted {
    type Request = ();
    /// The models this replica holds, the request's included.
    type Response = u32;
    type Model = ();

    async fn load_model(&self, _model_id: &str) -> Result<(), UserError> {
        self.loaded
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Ok(())
    }

    async fn unload_model(&self, _model_id: &str, _model: Arc<()>) {
        self.loaded
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }

    async fn handle(&self, _model: &(), _request: ()) -> Result<u32, UserError> {
        Ok(self.loaded.load(std::sync::atomic::Ordering::Acquire))
    }
}

/// A request router that sends every request to the replica with the lowest
/// id (the highest, with `{"highest": true}`), and waits while it has no room.
pub struct Pinned {
    highest: bool,
}

impl flotilla::RequestRouter for Pinned {
    fn choose(
        &self,
        _: &flotilla::RoutingRequest<'_>,
        replicas: &[Arc<flotilla::ReplicaEndpoint>],
    ) -> Option<usize> {
        let by_id = (0..replicas.len()).map(|i| (replicas[i].id(), i));
        let (_, i) = if self.highest {
            by_id.max()?
        } else {
            by_id.min()?
        };
        replicas[i].has_room().then_some(i)
    }
}

/// Where [`Waiter`] is registered.
pub const WAITER: &str = "where::Waiter";

/// Its constructor starts a task calling deployment `missing` of its own
/// application (there is none), which waits as long as the handle's route
/// lives, and logs how the call ended (`waiter: the call to deployment
/// missing ended`).
pub struct Waiter;

impl Deployment for Waiter {
    type Request = String;
    type Response = String;
    async fn handle(&self, request: String) -> Result<String, UserError> {
        Ok(request)
    }
}

/// Where [`Pinned`] is registered.
pub const PINNED: &str = "where.routers:Pinned";

/// The [`Pinned`] router's config: `highest` picks the highest id.
pub fn pinned(highest: bool) -> flotilla::RequestRouterConfig {
    let kwargs = std::collections::BTreeMap::from([("highest", highest)]);
    flotilla::RequestRouterConfig {
        request_router_class: PINNED.try_into().unwrap(),
        request_router_kwargs: flotilla::Args::encode(&kwargs).unwrap(),
        ..flotilla::RequestRouterConfig::default()
    }
}

/// The registry every test process uses.
pub fn registry() -> Registry {
    Registry::new()
        .register_request_router(PINNED, |kwargs: &flotilla::Args| {
            let k: std::collections::BTreeMap<String, bool> =
                kwargs.decode().map_err(|e| UserError::new(e.to_string()))?;
            Ok(Pinned {
                highest: k.get("highest").copied().unwrap_or(false),
            })
        })
        .unwrap()
        .register(
            "where::Batched",
            |_ctx: InitContext| async move { Ok(Batched) },
        )
        .unwrap()
        // Never starts: its deployment is DEPLOY_FAILED.
        .register(WAITER, |ctx: InitContext| async move {
            let missing = ctx.handle("missing")?;
            tokio::spawn(async move {
                let ended = missing.call::<_, String>("x").await;
                tracing::info!(?ended, "waiter: the call to deployment missing ended");
            });
            Ok(Waiter)
        })
        .unwrap()
        .register("where::Broken", |_ctx: InitContext| async move {
            Err::<Batched, _>(UserError::new("broken on purpose"))
        })
        .unwrap()
        .register_multiplexed("where::Counted", |_ctx: InitContext| async move {
            Ok(Counted::default())
        })
        .unwrap()
        .register("where::ModelCaller", |ctx: InitContext| async move {
            Ok(ModelCaller {
                models: ctx.handle("models")?,
            })
        })
        .unwrap()
        .register_multiplexed("where::Models", |ctx: InitContext| async move {
            Ok(Models {
                node: ctx.node.clone(),
            })
        })
        .unwrap()
        .register("where::Where", |ctx: InitContext| async move {
            let args: WhereArgs = ctx.args().unwrap_or_default();
            let downstream = match (&args.downstream, &args.downstream_app) {
                (Some(d), None) => Some(ctx.handle(d)?),
                (Some(d), Some(app)) => {
                    let bad = |e: &dyn std::fmt::Display| UserError::new(e.to_string());
                    let app = flotilla::AppName::new(app).map_err(|e| bad(&e))?;
                    let dep = flotilla::DeploymentName::new(d).map_err(|e| bad(&e))?;
                    Some(ctx.handle_in(&app, &dep))
                }
                (None, _) => None,
            };
            Ok(Where {
                node: ctx.node.clone(),
                replica: ctx.replica.0,
                args,
                downstream,
                in_flight: Default::default(),
            })
        })
        .unwrap()
}

/// A deployment of `Where` with `replicas` replicas reserving `resources`.
pub fn where_dep(
    name: &str,
    replicas: u32,
    resources: Resources,
    args: &WhereArgs,
) -> flotilla::DeploymentSpecBuilder {
    DeploymentSpec::builder(name, "where::Where")
        .replicas(replicas)
        .init_args(args)
        .with_config(|c| c.with_resources(resources))
}

/// An application of one `Where` deployment.
pub fn where_app(name: &str, replicas: u32, resources: Resources) -> ApplicationSpec {
    ApplicationSpec::builder(name)
        .deployment(where_dep(
            "where",
            replicas,
            resources,
            &WhereArgs::default(),
        ))
        .build()
        .unwrap()
}

/// An application `name` of one multiplexed `Models` deployment, `models`,
/// whose `replicas` replicas each need one `gpu` (a custom resource).
pub fn models_app(name: &str, replicas: u32) -> ApplicationSpec {
    ApplicationSpec::builder(name)
        .deployment(
            DeploymentSpec::builder("models", "where::Models")
                .replicas(replicas)
                .with_config(|c| c.with_resources(Resources::none().with_custom("gpu", 1.0))),
        )
        .build()
        .unwrap()
}

/// A head on loopback, port 0, with `resources`, storing in `dir`.
pub async fn head(dir: &Path, resources: Resources) -> Serve {
    head_at(dir, resources, "127.0.0.1:0".parse().unwrap()).await
}

/// A loopback address with a free port outside the kernel's ephemeral range,
/// for a head that must listen on the same port again after a restart: a
/// port that `bind(0)` or an outgoing connection may be given could be taken
/// by one in between (the nodes redial the dead head's port, and a connection
/// to a local port without a listener can even be given that port itself).
/// The search starts at a port derived from this process's id, so two test
/// binaries at once look in different places.
pub fn restartable_addr() -> SocketAddr {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| {
            let mut it = r.split_whitespace().map(|p| p.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32768, 60999));
    // Below the range (from 10000, clear of well-known ports) if there is
    // room there, else above it.
    let (lo, hi) = match (range.0.checked_sub(1), range.1.checked_add(1)) {
        (Some(below), _) if below >= 10000 => (10000, below),
        (_, Some(above)) => (above, u16::MAX),
        _ => panic!("no loopback port outside the ephemeral range {range:?}"),
    };
    let span = u32::from(hi - lo) + 1;
    let start = std::process::id() % span;
    (0..span)
        .map(|i| lo + ((start + i) % span) as u16)
        .map(|port| SocketAddr::from(([127, 0, 0, 1], port)))
        .find(|addr| std::net::TcpListener::bind(addr).is_ok())
        .expect("a free loopback port outside the ephemeral range")
}

/// A head listening on `listen`.
pub async fn head_at(dir: &Path, resources: Resources, listen: SocketAddr) -> Serve {
    head_with(dir, resources, listen, |o| o).await
}

/// A head listening on `listen`, its options changed by `change`.
pub async fn head_with(
    dir: &Path,
    resources: Resources,
    listen: SocketAddr,
    change: impl FnOnce(HeadOptions) -> HeadOptions,
) -> Serve {
    let options = change(
        HeadOptions::new(Cookie::new(COOKIE).unwrap())
            .listen(listen)
            .resources(resources)
            .reattach_grace(Duration::from_secs(10)),
    );
    Serve::start(
        ServeOptions::new(registry())
            .store_path(dir.join("flotilla.redb"))
            .nodes(options),
    )
    .await
    .unwrap()
}

/// What a node process offers and is called.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub name: String,
    pub cpus: f64,
    pub gpus: f64,
    pub custom: Vec<(String, f64)>,
    pub cookie: String,
    /// A peer it dials at another address: (where the peer listens, where
    /// to dial it), `NodeOptions::dial_peer_via`.
    pub dial_via: Option<(SocketAddr, SocketAddr)>,
    /// Where it binds its listener (`NodeOptions::listen`, `listen_port`);
    /// its cookie then comes from the environment (a node listening off
    /// loopback takes none given in code).
    pub listen: Option<SocketAddr>,
}

impl NodeSpec {
    pub fn new(name: &str, cpus: f64) -> Self {
        NodeSpec {
            name: name.to_owned(),
            cpus,
            gpus: 0.0,
            custom: Vec::new(),
            cookie: COOKIE.to_owned(),
            dial_via: None,
            listen: None,
        }
    }

    pub fn listen(mut self, at: SocketAddr) -> Self {
        self.listen = Some(at);
        self
    }

    pub fn dial_via(mut self, listen: SocketAddr, via: SocketAddr) -> Self {
        self.dial_via = Some((listen, via));
        self
    }

    pub fn gpus(mut self, gpus: f64) -> Self {
        self.gpus = gpus;
        self
    }

    pub fn custom(mut self, name: &str, amount: f64) -> Self {
        self.custom.push((name.to_owned(), amount));
        self
    }

    pub fn cookie(mut self, cookie: &str) -> Self {
        self.cookie = cookie.to_owned();
        self
    }

    fn line(&self, head: SocketAddr) -> String {
        let custom: Vec<String> = self
            .custom
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        format!(
            "{head} {} {} {} {} {} {} {}",
            self.cookie,
            self.name,
            self.cpus,
            self.gpus,
            if custom.is_empty() {
                "-".to_owned()
            } else {
                custom.join(",")
            },
            match self.dial_via {
                Some((listen, via)) => format!("{listen}={via}"),
                None => "-".to_owned(),
            },
            self.listen.map_or("-".to_owned(), |at| at.to_string()),
        )
    }
}

/// The node child's side: parse the config line, run a node, print each node
/// id, end when stdin closes (the parent went away).
pub fn run_child(line: &str) {
    let parts: Vec<&str> = line.split(' ').collect();
    let head: SocketAddr = parts[0].parse().unwrap();
    let mut resources = Resources::none()
        .with_cpus(parts[3].parse().unwrap())
        .with_gpus(parts[4].parse().unwrap());
    if parts[5] != "-" {
        for kv in parts[5].split(',') {
            let (k, v) = kv.split_once('=').unwrap();
            resources = resources.with_custom(k, v.parse().unwrap());
        }
    }
    // Its own log on stderr, and its replicas' by the head's logging
    // settings (`AppLogLayer`) in the file the test named.
    let logging = flotilla::LogSettings::new();
    let applog = std::env::var(APPLOG_ENV).unwrap();
    let applog = Arc::new(std::fs::File::create(applog).unwrap());
    {
        use tracing_subscriber::{Layer, layer::SubscriberExt};
        let own = tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_filter(tracing_subscriber::filter::LevelFilter::INFO);
        let by_settings = flotilla::AppLogLayer::new(logging.clone(), applog);
        let _ = tracing::subscriber::set_global_default(
            tracing_subscriber::registry().with(own).with(by_settings),
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Its stdin: `DROP_PEER <node id>` lines (NodeProc::drop_peer_session),
    // `SHUTDOWN` (NodeProc::shutdown), and the end when the parent goes away.
    // A `None` on the channel asks for the shutdown.
    let (drops_tx, mut drops) = tokio::sync::mpsc::unbounded_channel::<Option<String>>();
    std::thread::spawn(move || {
        let mut buf = String::new();
        while std::io::stdin()
            .read_line(&mut buf)
            .map(|n| n > 0)
            .unwrap_or(false)
        {
            if let Some(id) = buf.trim().strip_prefix("DROP_PEER ") {
                let _ = drops_tx.send(Some(id.to_owned()));
            } else if buf.trim() == "SHUTDOWN" {
                let _ = drops_tx.send(None);
            }
            buf.clear();
        }
        std::process::exit(0);
    });
    let code = rt.block_on(async move {
        let listen: Option<SocketAddr> = (parts[7] != "-").then(|| parts[7].parse().unwrap());
        let cookie = match listen {
            Some(_) => Cookie::from_env(CHILD_COOKIE_ENV).unwrap(),
            None => Cookie::new(parts[1]).unwrap(),
        };
        let mut options = flotilla::node::NodeOptions::new(head, cookie)
            .name(parts[2])
            .resources(resources)
            .label("test", "yes");
        if let Some(at) = listen {
            options = options.listen(at.ip()).listen_port(at.port());
        }
        options.logging = logging.clone();
        if let Some((listen, via)) = parts[6].split_once('=') {
            options = options.dial_peer_via(listen.parse().unwrap(), via.parse().unwrap());
        }
        let node = match flotilla::node::start(registry(), options).await {
            Ok(n) => n,
            Err(e) => {
                eprintln!("node failed to start: {e}");
                return 2;
            }
        };
        let mut ids = node.watch_id();
        let printer = tokio::spawn(async move {
            loop {
                let id = ids.borrow_and_update().clone();
                println!("NODE_ID {id}");
                let _ = std::io::stdout().flush();
                if ids.changed().await.is_err() {
                    return;
                }
            }
        });
        let mut live = node.watch_replicas();
        let counter = tokio::spawn(async move {
            loop {
                let n = *live.borrow_and_update();
                println!("NODE_REPLICAS {n}");
                let _ = std::io::stdout().flush();
                if live.changed().await.is_err() {
                    return;
                }
            }
        });
        // Each time the head's logging settings arrive: what they are now.
        let mut settings = logging.subscribe();
        let logging_printer = tokio::spawn(async move {
            while settings.changed().await.is_ok() {
                println!("NODE_LOGGING {:?}", logging.snapshot());
                let _ = std::io::stdout().flush();
            }
        });
        let node = Arc::new(node);
        let dropping = node.clone();
        // Returns (with its clone of the node) when a shutdown is asked.
        let mut dropper = tokio::spawn(async move {
            while let Some(Some(id)) = drops.recv().await {
                let dropped = dropping.drop_peer_session(&id).await;
                println!("NODE_DROPPED {id} {dropped}");
                let _ = std::io::stdout().flush();
            }
        });
        // The node's task ended once its id can no longer change.
        let mut ended = node.watch_id();
        let shutdown = tokio::select! {
            () = async { while ended.changed().await.is_ok() {} } => false,
            _ = &mut dropper => true,
        };
        if !shutdown {
            dropper.abort();
            let _ = dropper.await;
        }
        let r = match Arc::into_inner(node) {
            Some(node) if shutdown => node.shutdown().await,
            Some(node) => node.wait().await,
            None => Ok(()),
        };
        printer.abort();
        counter.abort();
        logging_printer.abort();
        match r {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("NODE_ERROR {e}");
                3
            }
        }
    });
    std::process::exit(code);
}

/// A node process of this test binary; killed when dropped.
pub struct NodeProc {
    pub child: Child,
    ids: Arc<Mutex<Vec<String>>>,
    replicas: Arc<std::sync::atomic::AtomicUsize>,
    /// Told after each node id or logging settings it prints.
    printed: Arc<tokio::sync::Notify>,
    /// Its `NODE_LOGGING` lines (the logging settings it was sent).
    logging: Arc<Mutex<Vec<String>>>,
    pub log: PathBuf,
    /// What its `AppLogLayer` wrote.
    pub applog: PathBuf,
}

impl NodeProc {
    /// Start one as `node_child` of this binary, joining `head`.
    pub fn start(head: SocketAddr, spec: &NodeSpec, log_dir: &Path) -> NodeProc {
        let log = log_dir.join(format!("{}.log", spec.name));
        let applog = log_dir.join(format!("{}.applog", spec.name));
        let err = std::fs::File::create(&log).unwrap();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "--ignored",
                "node_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, spec.line(head))
            .env(CHILD_COOKIE_ENV, &spec.cookie)
            .env(APPLOG_ENV, &applog)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .unwrap();
        let ids = Arc::new(Mutex::new(Vec::new()));
        let printed = Arc::new(tokio::sync::Notify::new());
        let out = child.stdout.take().unwrap();
        let replicas = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let logging = Arc::new(Mutex::new(Vec::new()));
        let (ids2, changed2, replicas2) = (ids.clone(), printed.clone(), replicas.clone());
        let logging2 = logging.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                if let Some(at) = line.find("NODE_LOGGING ") {
                    logging2.lock().unwrap().push(line[at + 13..].to_owned());
                    changed2.notify_waiters();
                }
                if let Some(at) = line.find("NODE_ID ") {
                    ids2.lock().unwrap().push(line[at + 8..].trim().to_owned());
                    changed2.notify_waiters();
                }
                if let Some(at) = line.find("NODE_REPLICAS ")
                    && let Ok(n) = line[at + 14..].trim().parse()
                {
                    replicas2.store(n, std::sync::atomic::Ordering::Release);
                }
            }
        });
        NodeProc {
            child,
            ids,
            replicas,
            printed,
            logging,
            log,
            applog,
        }
    }

    /// Replicas the node process runs now (as it last printed).
    pub fn replicas(&self) -> usize {
        self.replicas.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Wait for its exit code. Its stdin stays open meanwhile (`Child::wait`
    /// would close it, and a node process exits when its stdin closes: its
    /// parent, the test, is gone). Blocking: call it off the runtime; a node
    /// that never exits is the test's hang, ended by its watchdog.
    pub fn wait_exit(&mut self) -> Option<i32> {
        let stdin = self.child.stdin.take();
        let status = self.child.wait();
        self.child.stdin = stdin;
        status.ok().and_then(|s| s.code())
    }

    /// Every node id it had, in order.
    pub fn ids(&self) -> Vec<String> {
        self.ids.lock().unwrap().clone()
    }

    /// Its node id once it printed one (at most 30 s).
    pub async fn id(&self) -> String {
        self.nth_id(0).await
    }

    /// Its `n`th node id (0 = the first), waiting for it.
    pub async fn nth_id(&self, n: usize) -> String {
        self.wait_printed(&format!("node id #{n}"), || self.ids().get(n).cloned())
            .await
    }

    /// Wait (at most 30 s) for logging settings from its head for which
    /// `check` holds (given their `Debug` text), and return them.
    pub async fn wait_logging(&self, check: impl Fn(&str) -> bool) -> String {
        self.wait_printed("such logging settings", || {
            self.logging_sent().into_iter().rev().find(|l| check(l))
        })
        .await
    }

    /// Wait (at most 30 s) until what it printed gives `found` a value,
    /// looking again after each node id or logging settings it prints;
    /// `what` names it in the panic if it never does.
    pub async fn wait_printed<T>(&self, what: &str, found: impl Fn() -> Option<T>) -> T {
        tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let notified = self.printed.notified();
                if let Some(v) = found() {
                    return v;
                }
                notified.await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{what} not printed; log:\n{}", self.log_text()))
    }

    /// Every logging settings it was sent so far, in order (their `Debug` text).
    pub fn logging_sent(&self) -> Vec<String> {
        self.logging.lock().unwrap().clone()
    }

    /// What its `AppLogLayer` wrote so far.
    pub fn applog_text(&self) -> String {
        std::fs::read_to_string(&self.applog).unwrap_or_default()
    }

    /// Its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Ask it to close its session to the node `peer` (its id), as
    /// `Node::drop_peer_session`; it logs "stopping the session".
    pub fn drop_peer_session(&mut self, peer: &str) {
        let stdin = self.child.stdin.as_mut().expect("piped stdin");
        writeln!(stdin, "DROP_PEER {peer}").unwrap();
        stdin.flush().unwrap();
    }

    /// Ask it to shut down as `Node::shutdown` does: its replicas drain, then
    /// it leaves and exits (0).
    pub fn shutdown(&mut self) {
        let stdin = self.child.stdin.as_mut().expect("piped stdin");
        writeln!(stdin, "SHUTDOWN").unwrap();
        stdin.flush().unwrap();
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGSTOP / SIGCONT (a hung process, as a partition looks).
    pub fn signal(&self, sig: &str) {
        let _ = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status();
    }
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- {} ---\n{}", self.log.display(), self.log_text());
        }
        self.signal("-CONT");
        self.kill();
    }
}

/// Wait until `check` holds, re-checking every 20 ms, for at most `secs`.
/// (Used where a cross-process state has no event to wait on here.)
pub async fn eventually<F, Fut>(secs: u64, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if check().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The node of every replica of `app`/`deployment`, from its snapshot.
pub async fn replica_nodes(
    serve: &Serve,
    app: &str,
    dep: &str,
) -> Vec<(u64, String, flotilla::ReplicaState)> {
    serve
        .deployment_snapshot(app, dep)
        .await
        .unwrap()
        .map(|s| {
            s.replicas
                .iter()
                .map(|r| (r.id.0, r.node.clone(), r.state))
                .collect()
        })
        .unwrap_or_default()
}

/// A TCP relay a test puts between two processes: it forwards each
/// connection to `upstream` until [`partition`](Relay::partition), after
/// which the connections it carried then go silent both ways, forwarding
/// nothing and closing nothing (a network partition), while connections
/// made later are forwarded (the path is back for new ones).
pub struct Relay {
    pub addr: SocketAddr,
    epoch: Arc<std::sync::atomic::AtomicU64>,
    accepted: Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    pub async fn start(upstream: SocketAddr) -> Relay {
        use std::sync::atomic::Ordering::SeqCst;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let epoch = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let accepted = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (e, a) = (epoch.clone(), accepted.clone());
        let task = tokio::spawn(async move {
            while let Ok((down, _)) = listener.accept().await {
                let Ok(up) = tokio::net::TcpStream::connect(upstream).await else {
                    continue;
                };
                a.fetch_add(1, SeqCst);
                let born = e.load(SeqCst);
                let (down_r, down_w) = down.into_split();
                let (up_r, up_w) = up.into_split();
                tokio::spawn(pump(down_r, up_w, e.clone(), born));
                tokio::spawn(pump(up_r, down_w, e.clone(), born));
            }
        });
        Relay {
            addr,
            epoch,
            accepted,
            task,
        }
    }

    /// Silence every connection carried now.
    pub fn partition(&self) {
        self.epoch.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Connections accepted (and connected upstream) so far.
    pub fn connections(&self) -> u64 {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copy `from` to `to` until either ends, or, once the relay partitioned
/// the connection, hold both ends open and forward nothing more (not even
/// an end).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    epoch: Arc<std::sync::atomic::AtomicU64>,
    born: u64,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = from.read(&mut buf).await.unwrap_or(0);
        if epoch.load(std::sync::atomic::Ordering::SeqCst) != born {
            std::future::pending::<()>().await;
        }
        if n == 0 || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
