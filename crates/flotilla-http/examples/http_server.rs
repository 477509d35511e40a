//! Flotilla over HTTP: register example code (an echo, a streaming token
//! generator, a greeter and the composed shop), apply `http_config.yaml`, and
//! serve it: the proxy on http://127.0.0.1:8000, the REST API and /metrics on
//! http://127.0.0.1:8265. Ctrl-C stops it.
//!
//! ```sh
//! cargo run --release -p flotilla-http --example http_server [-- CONFIG [STORE]]
//! curl http://127.0.0.1:8000/shop/pears
//! curl -N 'http://127.0.0.1:8000/tokens?prompt=one+token+at+a+time'
//! cargo run -p flotilla-http --bin flotilla -- status
//! cargo run -p flotilla-http --bin flotilla -- deploy crates/flotilla-http/examples/http_config_changed.yaml
//! ```

use std::{
    collections::BTreeMap,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use flotilla::{
    AppLogLayer, ApplicationSpec, Args, Deployment, DeploymentHandle, DeploymentSpec, Registry,
    Serve, ServeConfig, ServeOptions, UserError,
};
use flotilla_http::{HttpOptions, HttpRequest, HttpResponse, HttpServer};
use futures::{Stream, StreamExt, stream};
use serde::Deserialize;

fn user_error(e: impl std::fmt::Display) -> UserError {
    UserError::new(e.to_string())
}

/// Echoes the request as JSON.
struct Echo;

impl Deployment for Echo {
    type Request = HttpRequest;
    type Response = HttpResponse;
    async fn handle(&self, req: HttpRequest) -> Result<HttpResponse, UserError> {
        Ok(HttpResponse::json(
            200,
            &serde_json::json!({
                "method": req.method,
                "path": req.path,
                "route_path": req.route_path(),
                "query": req.query,
                "body": String::from_utf8_lossy(&req.body),
                "request_id": req.request_id(),
            }),
        ))
    }
}

/// Streams the words of `?prompt=` (or the body) back, one every `delay_ms`.
struct Tokens {
    delay: Duration,
}

fn prompt(req: &HttpRequest) -> String {
    let from_query = req
        .query
        .split('&')
        .find_map(|kv| kv.strip_prefix("prompt="));
    match from_query {
        Some(p) => percent_decode(&p.replace('+', " ")),
        None => String::from_utf8_lossy(&req.body).into_owned(),
    }
}

fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

impl Deployment for Tokens {
    type Request = HttpRequest;
    type Response = HttpResponse;

    async fn handle(&self, req: HttpRequest) -> Result<HttpResponse, UserError> {
        Ok(HttpResponse::text(200, prompt(&req)))
    }

    fn handle_stream(
        &self,
        req: HttpRequest,
    ) -> impl Stream<Item = Result<HttpResponse, UserError>> + Send + '_ {
        let words: Vec<String> = prompt(&req)
            .split_whitespace()
            .map(|w| format!("{w} "))
            .collect();
        let head = stream::once(async { Ok(HttpResponse::text(200, "")) });
        let delay = self.delay;
        let tokens = stream::iter(words).then(move |w| async move {
            tokio::time::sleep(delay).await;
            Ok(HttpResponse::chunk(w))
        });
        head.chain(tokens)
            .chain(stream::once(async { Ok(HttpResponse::chunk("\n")) }))
    }
}

#[derive(Deserialize)]
struct GreeterArgs {
    greeting: String,
    punctuation: String,
}

/// Greets the name after its route (`/greet/ada`).
struct Greeter {
    args: GreeterArgs,
    shout: AtomicBool,
}

impl Deployment for Greeter {
    type Request = HttpRequest;
    type Response = HttpResponse;
    async fn handle(&self, req: HttpRequest) -> Result<HttpResponse, UserError> {
        let name = req.route_path().trim_matches('/');
        let name = if name.is_empty() { "world" } else { name };
        let text = format!("{}, {name}{}\n", self.args.greeting, self.args.punctuation);
        let text = if self.shout.load(Ordering::Relaxed) {
            text.to_uppercase()
        } else {
            text
        };
        Ok(HttpResponse::text(200, text))
    }
    async fn reconfigure(&self, user_config: Args) -> Result<(), UserError> {
        #[derive(Deserialize)]
        struct Config {
            shout: bool,
        }
        let c: Config = user_config.decode().map_err(user_error)?;
        self.shout.store(c.shout, Ordering::Relaxed);
        Ok(())
    }
}

#[derive(Deserialize, serde::Serialize, Clone)]
struct ShopArgs {
    currency: String,
    catalog: Vec<String>,
    discount: f64,
}

/// The shop's HTTP ingress: `/shop/<item>` asks the pricing model for its price.
struct Front {
    pricing: DeploymentHandle,
    currency: String,
}

impl Deployment for Front {
    type Request = HttpRequest;
    type Response = HttpResponse;
    async fn handle(&self, req: HttpRequest) -> Result<HttpResponse, UserError> {
        let item = req.route_path().trim_matches('/').to_owned();
        match self.pricing.call::<_, f64>(&item).await {
            Ok(price) => Ok(HttpResponse::text(
                200,
                format!("{item}: {price:.2} {}\n", self.currency),
            )),
            Err(flotilla::CallError::User(m)) => Ok(HttpResponse::text(404, format!("{m}\n"))),
            Err(e) => Err(user_error(e)),
        }
    }
}

/// Prices an item of the catalog.
struct Pricing {
    catalog: Vec<String>,
    discount: f64,
}

impl Deployment for Pricing {
    type Request = String;
    type Response = f64;
    async fn handle(&self, item: String) -> Result<f64, UserError> {
        let index = self
            .catalog
            .iter()
            .position(|c| *c == item)
            .ok_or_else(|| UserError::new(format!("no such item: {item:?}")))?;
        Ok((1.0 + index as f64) * (1.0 - self.discount))
    }
}

fn registry() -> Result<Registry, Box<dyn std::error::Error>> {
    Ok(Registry::new()
        .register("examples::Echo", |_ctx| async { Ok(Echo) })?
        .register("examples::Tokens", |ctx| async move {
            let a: BTreeMap<String, u64> = ctx.args()?;
            Ok(Tokens {
                delay: Duration::from_millis(a.get("delay_ms").copied().unwrap_or(50)),
            })
        })?
        .register("examples::Greeter", |ctx| async move {
            Ok(Greeter {
                args: ctx.args()?,
                shout: AtomicBool::new(false),
            })
        })?
        .register("examples::Front", |ctx| async move {
            let args: ShopArgs = ctx.args()?;
            Ok(Front {
                pricing: ctx.handle("pricing")?,
                currency: args.currency,
            })
        })?
        .register("examples::Pricing", |ctx| async move {
            let args: ShopArgs = ctx.args()?;
            Ok(Pricing {
                catalog: args.catalog,
                discount: args.discount,
            })
        })?
        .register_app("examples.echo:app", |_args: Args| async {
            ApplicationSpec::builder("echo")
                .deployment(DeploymentSpec::builder("echo", "examples::Echo"))
                .build()
                .map_err(user_error)
        })?
        .register_app("examples.tokens:app", |args: Args| async move {
            let a: BTreeMap<String, u64> = args.decode().map_err(user_error)?;
            ApplicationSpec::builder("tokens")
                .deployment(DeploymentSpec::builder("tokens", "examples::Tokens").init_args(&a))
                .build()
                .map_err(user_error)
        })?
        .register_app("examples.greeter:app", |args: Args| async move {
            let a: BTreeMap<String, String> = args.decode().map_err(user_error)?;
            ApplicationSpec::builder("greeter")
                .deployment(DeploymentSpec::builder("greeter", "examples::Greeter").init_args(&a))
                .build()
                .map_err(user_error)
        })?
        .register_app("examples.shop:app", |args: Args| async move {
            let a: ShopArgs = args.decode().map_err(user_error)?;
            ApplicationSpec::builder("shop")
                .deployment(DeploymentSpec::builder("front", "examples::Front").init_args(&a))
                .deployment(DeploymentSpec::builder("pricing", "examples::Pricing").init_args(&a))
                .ingress("front")
                .build()
                .map_err(user_error)
        })?)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let Err(e) = run().await else {
        return std::process::ExitCode::SUCCESS;
    };
    eprintln!("error: {}", flotilla::with_causes(e.as_ref()));
    std::process::ExitCode::FAILURE
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut argv = std::env::args().skip(1);
    let config_path = argv.next().unwrap_or_else(|| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/examples/http_config.yaml").to_owned()
    });
    // Read and checked before anything starts: a bad file changes nothing.
    let text = std::fs::read_to_string(&config_path)
        .map_err(|e| format!("cannot read {config_path}: {e}"))?;
    let config = ServeConfig::from_yaml(&text)?;
    let (store, _scratch) = match argv.next() {
        Some(s) => (std::path::PathBuf::from(s), None),
        None => {
            let dir = tempfile::tempdir()?;
            (dir.path().join("flotilla.redb"), Some(dir))
        }
    };
    let options = ServeOptions::new(registry()?).store_path(&store);
    // Every event is filtered, formatted and filed by the logging_config of
    // its application (and deployment), or the config's global one.
    {
        use tracing_subscriber::layer::SubscriberExt;
        let layer = AppLogLayer::new(options.logging.clone(), std::io::stderr);
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))?;
    }
    let serve = Serve::start(options).await?;
    // Listening first, with the config's http_options: a port in use stops
    // the example before the config is applied.
    let http_options = HttpOptions::builder().serve_config(&config).build()?;
    let http = match HttpServer::start(&serve, http_options).await {
        Ok(http) => http,
        Err(e) => {
            serve.shutdown().await?;
            return Err(e.into());
        }
    };
    serve.apply_config(config).await?;
    println!("applied {config_path}");
    match http.proxy_addr() {
        Some(proxy) => {
            println!("proxy:    http://{proxy}");
            println!("try:      curl http://{proxy}/shop/pears");
        }
        None => println!("proxy:    off (proxy_location: Disabled)"),
    }
    if let Some(rest) = http.rest_addr() {
        println!(
            "REST API: http://{rest}/api/serve/applications/   metrics: http://{rest}/metrics"
        );
    }
    println!("Ctrl-C to stop.");
    tokio::signal::ctrl_c().await?;
    println!("stopping");
    http.shutdown().await;
    serve.shutdown().await?;
    Ok(())
}
