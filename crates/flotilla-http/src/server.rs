//! [`HttpServer`]: both listeners, their accept loops and shutdown.

use std::{
    net::{SocketAddr, ToSocketAddrs},
    sync::{Arc, atomic::AtomicBool},
    time::Duration,
};

use flotilla::Serve;
use hyper::service::service_fn;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
};
use tokio::{net::TcpListener, sync::watch, task::JoinHandle};

use crate::{
    HttpError, HttpOptions,
    auth::Token,
    connection::{self, Bounds, InFlight},
    connection_limit::{ConnectionLimit, Next},
    metrics::ProxyMetrics,
    proxy::{Proxy, RequestIds},
    rest::Rest,
    table::RouteFollower,
};

/// Flotilla's HTTP server, started next to a [`Serve`] by the embedding
/// program: the proxy (Ray's, default `127.0.0.1:8000`) and the REST API with
/// `/metrics` (default `127.0.0.1:8265`). HTTP/1.1 and HTTP/2 (h2c, prior
/// knowledge) on both. It runs on the caller's tokio runtime until
/// [`shutdown`](Self::shutdown) (or until dropped, which stops accepting at once).
///
/// ```no_run
/// use flotilla::{Registry, Serve, ServeOptions};
/// use flotilla_http::{HttpOptions, HttpServer};
///
/// # async fn demo(registry: Registry) -> Result<(), Box<dyn std::error::Error>> {
/// let serve = Serve::start(ServeOptions::new(registry)).await?;
/// let http = HttpServer::start(&serve, HttpOptions::default()).await?;
/// println!("proxy on {:?}, REST on {:?}", http.proxy_addr(), http.rest_addr());
/// // ... serve until asked to stop ...
/// http.shutdown().await;
/// serve.shutdown().await?;
/// # Ok(()) }
/// ```
pub struct HttpServer {
    proxy_addr: Option<SocketAddr>,
    rest_addr: Option<SocketAddr>,
    stop: watch::Sender<bool>,
    draining: Arc<AtomicBool>,
    proxy: Arc<Proxy>,
    tasks: Vec<JoinHandle<()>>,
    grace: Duration,
}

impl std::fmt::Debug for HttpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpServer")
            .field("proxy_addr", &self.proxy_addr)
            .field("rest_addr", &self.rest_addr)
            .finish()
    }
}

fn resolve(listener: &'static str, host: &str, port: u16) -> Result<SocketAddr, HttpError> {
    let resolve_err = |source| HttpError::Resolve {
        listener,
        host: host.to_owned(),
        port,
        source,
    };
    (host, port)
        .to_socket_addrs()
        .map_err(resolve_err)?
        .next()
        .ok_or_else(|| resolve_err(std::io::Error::other("no address")))
}

/// The addresses of the listeners `options` runs, resolved: the proxy's and
/// the REST API's. A disabled listener binds nothing, so its host is neither
/// resolved nor held to any rule. Two listeners on one port of overlapping
/// addresses are refused: the second bind would fail.
fn addresses(options: &HttpOptions) -> Result<(Option<SocketAddr>, Option<SocketAddr>), HttpError> {
    let proxy = match options.proxy {
        true => Some(resolve("proxy", &options.host, options.port)?),
        false => None,
    };
    let rest = match options.rest {
        true => Some(resolve("rest", &options.rest_host, options.rest_port)?),
        false => None,
    };
    if let (Some(p), Some(r)) = (proxy, rest)
        && p.port() != 0
        && p.port() == r.port()
        && (p.ip() == r.ip() || p.ip().is_unspecified() || r.ip().is_unspecified())
    {
        return Err(HttpError::SharedPort { port: p.port() });
    }
    Ok((proxy, rest))
}

/// What [`HttpServer::start`] refuses of `options` before it binds (a host
/// that does not resolve, the proxy and the REST API on one port, an address
/// off loopback without a token), for a server with a token or without. A
/// `PUT` checks its `http_options` with it, so that a stored config cannot
/// stop the next start (and so the REST API that could mend it). It resolves
/// host names: call it off the runtime's threads.
pub(crate) fn check_startable(
    options: &HttpOptions,
    token: Option<usize>,
) -> Result<(), HttpError> {
    let (proxy, rest) = addresses(options)?;
    check_exposure(options.rest, token, [("proxy", proxy), ("rest", rest)])
}

/// Whether the proxy of `options` could bind, as far as this process can
/// tell while its own proxy (bound at `running`) holds its address: its host
/// must be an address of this machine, and a port other than the running
/// proxy's must be free now. A `PUT` checks its `http_options` with it
/// (after [`check_startable`]), so that a stored config does not fail the
/// next start's bind (and stop the REST API with it); a port taken only
/// later still does. The field to blame comes with the error. It binds
/// sockets and resolves host names: call it off the runtime's threads.
pub(crate) fn check_bindable(
    options: &HttpOptions,
    running: Option<SocketAddr>,
) -> Result<(), (&'static str, HttpError)> {
    if !options.proxy {
        return Ok(());
    }
    let addr =
        resolve("proxy", &options.host, options.port).map_err(|e| ("http_options.host", e))?;
    let probe = |a: SocketAddr| {
        std::net::TcpListener::bind(a)
            .map(drop)
            .map_err(|source| HttpError::Bind { addr: a, source })
    };
    probe(SocketAddr::new(addr.ip(), 0)).map_err(|e| ("http_options.host", e))?;
    // The running proxy's own port is taken by itself: not probed.
    if addr.port() != 0 && running.is_none_or(|r| r.port() != addr.port()) {
        probe(addr).map_err(|e| ("http_options.port", e))?;
    }
    Ok(())
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, HttpError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| HttpError::Bind { addr, source })
}

/// Serve connections from `listener` with `service`, at most `limit`'s open
/// at once, until `stop`; then let open connections finish for up to `grace`.
fn accept_loop<S, B>(
    limit: Arc<ConnectionLimit>,
    listener: TcpListener,
    options: &HttpOptions,
    service: S,
    mut stop: watch::Receiver<bool>,
    grace: Duration,
) -> JoinHandle<()>
where
    S: Fn(
            http::Request<hyper::body::Incoming>,
        ) -> futures::future::BoxFuture<
            'static,
            Result<http::Response<B>, std::convert::Infallible>,
        > + Clone
        + Send
        + Sync
        + 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .keep_alive(true)
        // Started whenever a connection waits for a request's head (uvicorn's
        // timeout_keep_alive); `connection::serve` bounds the rest.
        .header_read_timeout(options.keep_alive_timeout);
    builder.http2().timer(TokioTimer::new());
    let idle = options.keep_alive_timeout;
    let name = limit.listener;
    tokio::spawn(async move {
        // Each connection holds a receiver until it ends.
        let (open, opened) = watch::channel(());
        loop {
            // A place first (see `ConnectionLimit::next`).
            let (place, accepted) = match limit.next(&listener, &mut stop).await {
                Next::Stop => break,
                Next::Place(place) => tokio::select! {
                    accepted = listener.accept() => (place, accepted),
                    () = crate::stopped(&mut stop) => break,
                },
                Next::Newcomer(place, newcomer) => (place, Ok(newcomer)),
                Next::Failed(e) => {
                    accept_failed(name, &e).await;
                    continue;
                }
            };
            let (stream, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    accept_failed(name, &e).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let load = InFlight::new();
            let (svc, counted) = (service.clone(), load.clone());
            let conn = builder
                .serve_connection_with_upgrades(
                    TokioIo::new(stream),
                    service_fn(move |req| counted.track(svc(req))),
                )
                .into_owned();
            let bounds = Bounds {
                listener: name,
                peer,
                idle,
                grace,
            };
            let (stop, open) = (stop.clone(), opened.clone());
            let place = limit.opened(place, &load);
            tokio::spawn(async move {
                connection::serve(conn, load, bounds, stop, open).await;
                drop(place);
            });
        }
        drop((listener, opened));
        // Every connection bounds its own close by `grace`.
        open.closed().await;
    })
}

/// An accept failed (out of descriptors and the like): say so, and keep
/// serving the others.
async fn accept_failed(listener: &'static str, error: &std::io::Error) {
    tracing::warn!(listener, %error, "accept failed");
    tokio::time::sleep(Duration::from_millis(10)).await;
}

impl HttpServer {
    /// Lay the applied config's `http_options` and `proxy_location` over
    /// `options` (the fields the config gives win; see
    /// [`HttpOptionsBuilder::serve_config`](crate::HttpOptionsBuilder::serve_config)),
    /// validate, check the bind rule (a non-loopback address needs a bearer
    /// token), load the token, bind the listeners, and start serving. Returns
    /// once they listen; nothing listens after an error.
    pub async fn start(serve: &Serve, options: HttpOptions) -> Result<HttpServer, HttpError> {
        let base_options = Arc::new(options.clone());
        let options = match serve.applied_config().await {
            Ok(Some(config)) => {
                // The program's own first: an error in them is theirs.
                options.validate()?;
                crate::HttpOptionsBuilder::from(options)
                    .serve_config(&config)
                    .build()
                    .map_err(|e| HttpError::AppliedConfigOptions(Box::new(e)))?
            }
            Ok(None) => options,
            Err(source) => return Err(HttpError::AppliedConfig(Box::new(source))),
        };
        options.validate()?;
        let (proxy_addr, rest_addr) = addresses(&options)?;
        let token = options.token.as_ref().map(Token::load).transpose()?;
        check_exposure(
            rest_addr.is_some(),
            token.as_ref().map(Token::len),
            [("proxy", proxy_addr), ("rest", rest_addr)],
        )?;
        let proxy_listener = match proxy_addr {
            Some(a) => Some(bind(a).await?),
            None => None,
        };
        let rest_listener = match rest_addr {
            Some(a) => Some(bind(a).await?),
            None => None,
        };
        let proxy_addr = match (&proxy_listener, proxy_addr) {
            (Some(l), Some(a)) => Some(
                l.local_addr()
                    .map_err(|source| HttpError::Bind { addr: a, source })?,
            ),
            _ => None,
        };
        let rest_addr = match (&rest_listener, rest_addr) {
            (Some(l), Some(a)) => Some(
                l.local_addr()
                    .map_err(|source| HttpError::Bind { addr: a, source })?,
            ),
            _ => None,
        };
        let options = Arc::new(options);
        let grace = options.shutdown_grace;
        let (stop, stop_rx) = watch::channel(false);
        let (routes, follower) = RouteFollower::follow(
            serve.routes().clone(),
            options.root_path.clone(),
            stop_rx.clone(),
        );
        let limit = |listener: &Option<TcpListener>, name| {
            listener
                .as_ref()
                .map(|_| ConnectionLimit::new(name, options.max_connections))
        };
        let (proxy_limit, rest_limit) = (
            limit(&proxy_listener, "proxy"),
            limit(&rest_listener, "rest"),
        );
        let metrics = Arc::new(ProxyMetrics::new(
            serve.node_id().to_owned(),
            proxy_addr.map(|a| a.ip().to_string()).unwrap_or_default(),
            proxy_limit.iter().chain(&rest_limit).cloned().collect(),
        ));
        let draining = Arc::new(AtomicBool::new(false));
        let reaper = crate::reaper::Reaper::new();
        let proxy = Arc::new(Proxy {
            serve: serve.clone(),
            routes: routes.clone(),
            options: options.clone(),
            metrics: metrics.clone(),
            ids: RequestIds::default(),
            draining: AtomicBool::new(false),
            reaper: reaper.clone(),
        });
        let mut tasks = vec![follower, tokio::spawn(reaper.run(stop_rx.clone()))];
        if let (Some(listener), Some(limit)) = (proxy_listener, proxy_limit) {
            let p = proxy.clone();
            tasks.push(accept_loop(
                limit,
                listener,
                &options,
                move |req| {
                    let p = p.clone();
                    Box::pin(p.handle(req))
                },
                stop_rx.clone(),
                grace,
            ));
        }
        if let (Some(listener), Some(limit)) = (rest_listener, rest_limit) {
            let rest = Arc::new(Rest {
                serve: serve.clone(),
                options: options.clone(),
                base_options,
                token,
                proxy_addr,
                proxy: Some((metrics, routes)),
                draining: draining.clone(),
                loopback_only: rest_addr.is_some_and(|a| a.ip().is_loopback()),
            });
            tasks.push(accept_loop(
                limit,
                listener,
                &options,
                move |req| {
                    let r = rest.clone();
                    Box::pin(r.handle(req))
                },
                stop_rx,
                grace,
            ));
        }
        tracing::info!(proxy = ?proxy_addr, rest = ?rest_addr, "flotilla HTTP server listening");
        Ok(HttpServer {
            proxy_addr,
            rest_addr,
            stop,
            draining,
            proxy,
            tasks,
            grace,
        })
    }

    /// Where the proxy listens (the actual port when 0 was asked); `None` when
    /// it is off (`proxy_location: Disabled`).
    pub fn proxy_addr(&self) -> Option<SocketAddr> {
        self.proxy_addr
    }

    /// Where the REST API and `/metrics` listen (`None` when disabled).
    pub fn rest_addr(&self) -> Option<SocketAddr> {
        self.rest_addr
    }

    /// Stop accepting connections (a new one is refused, which a load
    /// balancer takes as down at once), let open connections finish (up to
    /// the shutdown grace period), then return. A `/-/healthz` on a
    /// connection still open answers 503 (draining) meanwhile, and the REST
    /// details show the proxy `DRAINING`. Unlike Ray's proxy, which drains
    /// while it keeps accepting (a node being removed), this one goes with
    /// its process: nothing new is taken on. The `Serve` is left running.
    pub async fn shutdown(mut self) {
        self.draining
            .store(true, std::sync::atomic::Ordering::Release);
        self.proxy
            .draining
            .store(true, std::sync::atomic::Ordering::Release);
        let _ = self.stop.send(true);
        let tasks = std::mem::take(&mut self.tasks);
        let all = futures::future::join_all(tasks);
        if tokio::time::timeout(self.grace.saturating_add(Duration::from_secs(1)), all)
            .await
            .is_err()
        {
            tracing::warn!("HTTP server tasks did not stop in time");
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// The bind rule: with a REST listener (`rest_on`), exposing a listener off
/// loopback needs a token (`token`: its length) of at least
/// [`flotilla::MIN_EXPOSED_SECRET_LEN`] bytes; without a REST listener there
/// is no mutating endpoint to protect. `listeners` are the listeners with their addresses; `None` is one
/// that does not run (a disabled proxy binds nothing) or whose address is not
/// known.
fn check_exposure(
    rest_on: bool,
    token: Option<usize>,
    listeners: [(&'static str, Option<SocketAddr>); 2],
) -> Result<(), HttpError> {
    if !rest_on {
        return Ok(());
    }
    for (listener, addr) in listeners {
        if let Some(addr) = addr
            && !addr.ip().is_loopback()
        {
            return match token {
                None => Err(HttpError::TokenRequired { listener, addr }),
                Some(len) if len < flotilla::MIN_EXPOSED_SECRET_LEN => Err(HttpError::WeakToken {
                    listener,
                    addr,
                    len,
                    min: flotilla::MIN_EXPOSED_SECRET_LEN,
                }),
                Some(_) => Ok(()),
            };
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_loopback_the_token_must_be_long_enough_to_not_be_guessed() {
        let public = Some(SocketAddr::from(([0, 0, 0, 0], 8000)));
        let local = Some(SocketAddr::from(([127, 0, 0, 1], 52365)));
        let min = flotilla::MIN_EXPOSED_SECRET_LEN;
        let check =
            |proxy, len| check_exposure(true, Some(len), [("proxy", proxy), ("rest", local)]);
        assert!(matches!(
            check(public, min - 1),
            Err(HttpError::WeakToken { listener: "proxy", len, min: m, .. }) if len == min - 1 && m == min
        ));
        assert!(check(public, min).is_ok());
        // On loopback any token does.
        assert!(check(local, 1).is_ok());
    }

    #[test]
    fn off_loopback_needs_a_token_only_beside_a_rest_listener() {
        let (public, local) = (
            SocketAddr::from(([0, 0, 0, 0], 8000)),
            SocketAddr::from(([127, 0, 0, 1], 52365)),
        );
        let refused = |proxy, rest: Option<SocketAddr>, token: bool| match check_exposure(
            rest.is_some(),
            token.then_some(flotilla::MIN_EXPOSED_SECRET_LEN),
            [("proxy", proxy), ("rest", rest)],
        ) {
            Err(HttpError::TokenRequired { listener, .. }) => Some(listener),
            Ok(()) => None,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(refused(Some(public), Some(local), false), Some("proxy"));
        assert_eq!(refused(Some(local), Some(public), false), Some("rest"));
        assert_eq!(refused(Some(public), Some(public), true), None);
        assert_eq!(refused(Some(local), Some(local), false), None);
        // No REST listener: nothing to protect.
        assert_eq!(refused(Some(public), None, false), None);
        // No proxy: only the REST listener's address counts.
        assert_eq!(refused(None, Some(local), false), None);
        assert_eq!(refused(None, Some(public), false), Some("rest"));
    }

    #[test]
    fn what_a_start_refuses_before_it_binds_is_refused_ahead() {
        let check = |host: &str, port: u16, proxy: bool, token: bool| {
            let options = HttpOptions::builder()
                .host(host)
                .port(port)
                .rest_host("127.0.0.1")
                .rest_port(52365)
                .proxy(proxy)
                .build()
                .unwrap();
            check_startable(&options, token.then_some(32))
        };
        for public in ["0.0.0.0", "::", "10.1.2.3"] {
            assert!(
                matches!(
                    check(public, 8000, true, false),
                    Err(HttpError::TokenRequired {
                        listener: "proxy",
                        ..
                    })
                ),
                "{public}"
            );
            assert!(check(public, 8000, true, true).is_ok(), "{public}");
            assert!(check(public, 8000, false, false).is_ok(), "{public}");
        }
        // Loopback, literal or by name (localhost resolves without DNS).
        for host in ["127.0.0.1", "::1", "localhost"] {
            assert!(check(host, 8000, true, false).is_ok(), "{host}");
        }
        // The proxy on the REST API's port: the second bind would fail.
        for host in ["127.0.0.1", "0.0.0.0"] {
            assert!(
                matches!(
                    check(host, 52365, true, true),
                    Err(HttpError::SharedPort { port: 52365 })
                ),
                "{host}"
            );
        }
        assert!(check("127.0.0.2", 52365, true, true).is_ok());
        assert!(check("127.0.0.1", 52365, false, true).is_ok());
        // Without a REST listener there is nothing to protect.
        let no_rest = HttpOptions::builder()
            .host("0.0.0.0")
            .rest(false)
            .build()
            .unwrap();
        assert!(check_startable(&no_rest, None).is_ok());
    }
}
