//! The REST client: hyper-util's, HTTP/1.1, no TLS.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::{
    client::legacy::{Client as Hyper, connect::HttpConnector},
    rt::TokioExecutor,
};

/// The longest response the CLI reads (1 GiB): a server that sends more is
/// not one it can show.
pub const MAX_RESPONSE_BYTES: usize = 1 << 30;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The address is not `http://host:port`.
    #[error(
        "Got an unexpected address \"{0}\": it must start with http:// (TLS is not supported)."
    )]
    Address(String),
    /// The address starts with `http://` but is no URI (a space or a control
    /// character in it, no host).
    #[error("Got an unexpected address \"{address}\": it is not a valid http://host:port URI.")]
    InvalidAddress {
        /// The address.
        address: String,
        /// Why it does not parse.
        #[source]
        source: http::uri::InvalidUri,
    },
    /// The address names a port that is no port (`http://host:99999`): a
    /// request would go to port 80 instead, with the token.
    #[error("Got an unexpected address \"{0}\": its port must be a number from 1 to 65535.")]
    AddressPort(String),
    /// The server could not be reached.
    #[error("Failed to connect to Flotilla at address: {address}.")]
    Connect {
        /// The address.
        address: String,
        /// Why.
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    /// Reading the response failed.
    #[error("reading the response from {address} failed")]
    Read {
        /// The address.
        address: String,
        /// Why.
        #[source]
        source: hyper::Error,
    },
    /// The response was longer than the limit ([`MAX_RESPONSE_BYTES`]): not a Flotilla or
    /// Ray REST API (the details of 100,000 applications are a few hundred
    /// MB), or a wrong `--address`.
    #[error("the response from {address} is longer than {limit} bytes; is it a Serve REST API?")]
    TooLarge {
        /// The address.
        address: String,
        /// The limit.
        limit: usize,
    },
    /// The server answered with an error: shown as it wrote it.
    #[error("Request failed with status code {status}: {body}")]
    Server {
        /// The status.
        status: u16,
        /// The body, as the server wrote it.
        body: String,
    },
    /// A file could not be read.
    #[error("cannot read {}", path.display())]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The config file to deploy is larger than the server takes.
    #[error("config file {} is larger than {limit} bytes", path.display())]
    ConfigTooLarge {
        /// The file.
        path: PathBuf,
        /// The limit ([`flotilla::MAX_CONFIG_FILE_BYTES`]).
        limit: u64,
    },
    /// The token file holds no usable token: empty, more than one line, too
    /// long (the rule the server reads its own by, [`flotilla::secret_from_text`]).
    #[error("the bearer token in file {}: {source}", path.display())]
    Token {
        /// The token file.
        path: PathBuf,
        /// What is wrong with it (never the token itself).
        #[source]
        source: flotilla::SecretError,
    },
    /// The token cannot be sent in an `Authorization` header (which
    /// [`flotilla::secret_from_text`]'s rule, no control characters, rules out:
    /// the `http` crate's own check, kept as an error rather than a panic).
    #[error(
        "the bearer token in file {} cannot be sent in an HTTP header",
        path.display()
    )]
    BadToken {
        /// The token file (never the token itself).
        path: PathBuf,
        /// Why the header value is refused.
        #[source]
        source: http::header::InvalidHeaderValue,
    },
    /// The answer was not what the REST API sends.
    #[error("unexpected response from the server: {0}")]
    Decode(String),
    /// The terminal could not be read or written.
    #[error("terminal I/O failed")]
    Terminal(#[source] std::io::Error),
    /// The user said no.
    #[error("aborted")]
    Aborted,
}

/// A client of one REST API.
pub struct Client {
    address: String,
    /// The `Authorization` header's value, `Bearer <token>` (marked sensitive).
    token: Option<http::HeaderValue>,
    http: Hyper<HttpConnector, Full<Bytes>>,
    /// The longest response read ([`MAX_RESPONSE_BYTES`]).
    max_response: usize,
}

const APPLICATIONS: &str = "/api/serve/applications/";

impl Client {
    /// A client of the REST API at `address` (`http://host:port`), with no
    /// bearer token.
    pub fn new(address: &str) -> Result<Client, ClientError> {
        if !address.starts_with("http://") {
            return Err(ClientError::Address(address.to_owned()));
        }
        let uri = address
            .parse::<http::Uri>()
            .map_err(|source| ClientError::InvalidAddress {
                address: address.to_owned(),
                source,
            })?;
        // The URI parser takes any digits for a port, and the connector then
        // goes to port 80 for one that does not fit: the token with it.
        if let Some(authority) = uri.authority() {
            // The host and port: after any `user:password@`.
            let host_port = match authority.as_str().rsplit_once('@') {
                Some((_, rest)) => rest,
                None => authority.as_str(),
            };
            let after_host = match host_port.rsplit_once(']') {
                Some((_, rest)) => rest,
                None => host_port,
            };
            if after_host.contains(':') && authority.port_u16().is_none_or(|p| p == 0) {
                return Err(ClientError::AddressPort(address.to_owned()));
            }
        }
        Ok(Client {
            address: address.trim_end_matches('/').to_owned(),
            token: None,
            http: Hyper::builder(TokioExecutor::new()).build_http(),
            max_response: MAX_RESPONSE_BYTES,
        })
    }

    /// The same client, sending the bearer token in `path` with what changes
    /// state. The token is checked here: an empty file, or one whose token
    /// cannot be a header value, is refused.
    pub fn with_token_file(self, path: &Path) -> Result<Client, ClientError> {
        Ok(Client {
            token: Some(bearer(path)?),
            ..self
        })
    }

    /// Where the token would go in plaintext: `Some(warning)` when a token is
    /// given and the address is not loopback (plain HTTP: anyone on the path
    /// reads it).
    pub fn plaintext_warning(&self) -> Option<String> {
        self.token.as_ref()?;
        let host = self
            .address
            .parse::<http::Uri>()
            .ok()
            .and_then(|u| u.host().map(str::to_owned))
            .unwrap_or_default();
        let ip = host.trim_start_matches('[').trim_end_matches(']');
        let loopback = host == "localhost"
            || ip
                .parse::<std::net::IpAddr>()
                .is_ok_and(|a| a.is_loopback());
        (!loopback).then(|| {
            format!(
                "warning: the bearer token is sent unencrypted (plain HTTP) to {}; anyone on the \
                 network path can read it",
                self.address
            )
        })
    }

    /// The request: the token rides only on what changes state (`GET`s need
    /// none, as the server's rule says), so reads never expose it.
    fn request(
        &self,
        method: http::Method,
        path: &str,
        body: Vec<u8>,
        content_type: Option<&str>,
    ) -> Result<http::Request<Full<Bytes>>, ClientError> {
        let mut req = http::Request::builder()
            .method(method.clone())
            .uri(format!("{}{path}", self.address));
        if let Some(ct) = content_type {
            req = req.header(http::header::CONTENT_TYPE, ct);
        }
        if let (Some(t), false) = (&self.token, method == http::Method::GET) {
            req = req.header(http::header::AUTHORIZATION, t.clone());
        }
        // The headers were checked when the client was built: what is left to
        // refuse is the URI, made of the address.
        req.body(Full::new(Bytes::from(body)))
            .map_err(|_| ClientError::Address(self.address.clone()))
    }

    async fn send(
        &self,
        method: http::Method,
        path: &str,
        body: Vec<u8>,
        content_type: Option<&str>,
    ) -> Result<Bytes, ClientError> {
        let req = self.request(method, path, body, content_type)?;
        let resp = self
            .http
            .request(req)
            .await
            .map_err(|source| ClientError::Connect {
                address: self.address.clone(),
                source,
            })?;
        let status = resp.status().as_u16();
        let body = match Limited::new(resp.into_body(), self.max_response)
            .collect()
            .await
        {
            Ok(body) => body.to_bytes(),
            Err(e) => {
                return Err(match e.downcast::<hyper::Error>() {
                    Ok(source) => ClientError::Read {
                        address: self.address.clone(),
                        source: *source,
                    },
                    Err(_) => ClientError::TooLarge {
                        address: self.address.clone(),
                        limit: self.max_response,
                    },
                });
            }
        };
        if status != 200 {
            return Err(ClientError::Server {
                status,
                body: String::from_utf8_lossy(&body).into_owned(),
            });
        }
        Ok(body)
    }

    /// Send a config; the answer's body (its warnings, one per line).
    pub async fn put_config(
        &self,
        config: Vec<u8>,
        content_type: &str,
    ) -> Result<String, ClientError> {
        self.send(http::Method::PUT, APPLICATIONS, config, Some(content_type))
            .await
            .map(|body| String::from_utf8_lossy(&body).into_owned())
    }

    pub async fn details(&self) -> Result<serde_json::Value, ClientError> {
        let body = self
            .send(http::Method::GET, APPLICATIONS, Vec::new(), None)
            .await?;
        serde_json::from_slice(&body).map_err(|e| ClientError::Decode(e.to_string()))
    }

    pub async fn delete(&self) -> Result<(), ClientError> {
        self.send(http::Method::DELETE, APPLICATIONS, Vec::new(), None)
            .await
            .map(|_| ())
    }
}

/// The `Authorization` value for the token in `path`: `Bearer ` and the file's
/// one line, surrounding whitespace trimmed (as the server reads its own).
fn bearer(path: &Path) -> Result<http::HeaderValue, ClientError> {
    let text = std::fs::read_to_string(path).map_err(|source| ClientError::ReadFile {
        path: path.to_owned(),
        source,
    })?;
    let token = flotilla::secret_from_text(&text).map_err(|source| ClientError::Token {
        path: path.to_owned(),
        source,
    })?;
    let mut value = http::HeaderValue::from_str(&format!("Bearer {token}")).map_err(|source| {
        ClientError::BadToken {
            path: path.to_owned(),
            source,
        }
    })?;
    value.set_sensitive(true);
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(address: &str, token: Option<&str>) -> Client {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("token");
        if let Some(t) = token {
            std::fs::write(&path, t).unwrap_or_else(|e| panic!("{e}"));
        }
        let c = Client::new(address).unwrap_or_else(|e| panic!("{e}"));
        match token {
            Some(_) => c.with_token_file(&path).unwrap_or_else(|e| panic!("{e}")),
            None => c,
        }
    }

    #[test]
    fn an_address_that_is_no_uri_is_refused_saying_so() {
        for bad in ["http://a b", "http://", "http://a\tb:1"] {
            let e = Client::new(bad).err();
            assert!(
                matches!(&e, Some(ClientError::InvalidAddress { address, .. }) if address == bad),
                "{bad}: {e:?}"
            );
            let text = e.map(|e| e.to_string()).unwrap_or_default();
            assert!(!text.contains("must start with"), "{text}");
        }
        assert!(matches!(
            Client::new("https://x:1"),
            Err(ClientError::Address(_))
        ));
        assert!(Client::new("http://[::1]:8265/").is_ok());
    }

    #[test]
    fn an_address_whose_port_is_no_port_is_refused() {
        for bad in [
            "http://127.0.0.1:99999",
            "http://127.0.0.1:0",
            "http://[::1]:65536",
            "http://host:",
        ] {
            let e = Client::new(bad).err();
            assert!(
                matches!(&e, Some(ClientError::AddressPort(a)) if a == bad),
                "{bad}: {e:?}"
            );
        }
        for good in [
            "http://127.0.0.1:65535",
            "http://[::1]:1",
            "http://localhost",
            "http://user:pw@host",
            "http://user@host:8265",
        ] {
            assert!(Client::new(good).is_ok(), "{good}");
        }
    }

    /// A server that answers with more than the client reads is an error
    /// naming the limit, not a read of everything it sends.
    #[tokio::test]
    async fn a_response_longer_than_the_limit_is_refused() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let server = tokio::spawn(async move {
            for len in [1024usize, 1025] {
                let (mut conn, _) = listener.accept().await.unwrap_or_else(|e| panic!("{e}"));
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf).await;
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {len}\r\nconnection: close\r\n\r\n"
                );
                let _ = conn.write_all(head.as_bytes()).await;
                let _ = conn.write_all(&vec![b'x'; len]).await;
            }
        });
        let mut c = client(&format!("http://{addr}"), None);
        c.max_response = 1024;
        let fits = c
            .send(http::Method::GET, APPLICATIONS, Vec::new(), None)
            .await;
        assert_eq!(fits.map(|b| b.len()).ok(), Some(1024));
        let over = c
            .send(http::Method::GET, APPLICATIONS, Vec::new(), None)
            .await;
        assert!(
            matches!(over, Err(ClientError::TooLarge { limit: 1024, .. })),
            "{over:?}"
        );
        server.await.unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn the_token_rides_only_on_mutations() {
        let c = client("http://127.0.0.1:8265", Some("t0ken\n"));
        let auth = |m: http::Method| {
            c.request(m, APPLICATIONS, Vec::new(), None)
                .unwrap_or_else(|e| panic!("{e}"))
                .headers()
                .get(http::header::AUTHORIZATION)
                .map(|v| v.to_str().unwrap_or_default().to_owned())
        };
        assert_eq!(auth(http::Method::GET), None);
        assert_eq!(auth(http::Method::PUT).as_deref(), Some("Bearer t0ken"));
        assert_eq!(auth(http::Method::DELETE).as_deref(), Some("Bearer t0ken"));
    }

    #[test]
    fn an_empty_or_unsendable_token_file_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("token");
        use flotilla::SecretError::{Empty, NotOneLine};
        for (bad, why) in [
            ("", Empty),
            (" \n\t\n", Empty),
            ("t0k\nen", NotOneLine),
            ("t0k\u{7}en\n", NotOneLine),
            ("t0ken\n# rotated\n", NotOneLine),
        ] {
            std::fs::write(&path, bad).unwrap_or_else(|e| panic!("{e}"));
            let e = client("http://127.0.0.1:8265", None)
                .with_token_file(&path)
                .err();
            assert!(
                matches!(&e, Some(ClientError::Token { path: p, source }) if *p == path && *source == why),
                "{bad:?}: {e:?}"
            );
            let text = e.map(|e| e.to_string()).unwrap_or_default();
            assert!(
                text.contains(&path.display().to_string()) && !text.contains("t0k"),
                "{text}"
            );
        }
        // Any other character goes, as the server takes it (bytes).
        std::fs::write(&path, "t0kén\n").unwrap_or_else(|e| panic!("{e}"));
        let c = client("http://127.0.0.1:8265", None)
            .with_token_file(&path)
            .unwrap_or_else(|e| panic!("{e}"));
        let request = c
            .request(http::Method::PUT, APPLICATIONS, Vec::new(), None)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            request
                .headers()
                .get(http::header::AUTHORIZATION)
                .map(|v| v.as_bytes()),
            Some("Bearer t0kén".as_bytes())
        );
    }

    #[test]
    fn a_token_sent_off_loopback_is_warned_about() {
        for loopback in [
            "http://127.0.0.1:8265",
            "http://localhost:8265",
            "http://[::1]:8265",
        ] {
            assert_eq!(
                client(loopback, Some("t")).plaintext_warning(),
                None,
                "{loopback}"
            );
        }
        let w = client("http://10.0.0.5:8265", Some("t")).plaintext_warning();
        assert!(w.is_some_and(|w| w.contains("unencrypted") && w.contains("10.0.0.5")));
        assert_eq!(
            client("http://10.0.0.5:8265", None).plaintext_warning(),
            None
        );
    }
}
