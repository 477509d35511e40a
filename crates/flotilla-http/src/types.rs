//! What an HTTP ingress deployment receives and answers: serde types that cross
//! the data plane as MessagePack between processes (bodies as binaries), and
//! are moved, not encoded, to and from an ingress in the proxy's own process.

use bytes::Bytes;
use serde::{Deserialize, Serialize, de::DeserializeOwned};

/// One HTTP request, as the proxy hands it to an application's ingress
/// (`impl Deployment<Request = HttpRequest, Response = HttpResponse>`). The body
/// is read whole first (up to the server's limit).
///
/// Paths follow Ray's (uvicorn's) ASGI scope: `path` is the percent-decoded path
/// with the server's `root_path` in front; `root_path` is the server's
/// `root_path` plus the matched route prefix (unless the prefix is `/`), so
/// [`route_path`](Self::route_path), the part after it, is what the application
/// routes on (`/items/3` for `/app1/items/3` under prefix `/app1`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpRequest {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The percent-decoded path, `root_path` of the server included.
    pub path: String,
    /// The server's `root_path` plus the route prefix (see above).
    pub root_path: String,
    /// The route prefix that matched.
    pub route_prefix: String,
    /// The raw query string, without `?` ("" when there is none).
    pub query: String,
    /// Headers in arrival order, names lower-case; a value that is not UTF-8 is
    /// converted lossily. `x-request-id` is always there (the client's, or one
    /// the proxy made).
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Bytes,
}

impl HttpRequest {
    /// A request for `path` (tests and direct calls), with no headers or body.
    pub fn new(method: impl Into<String>, path: impl Into<String>) -> Self {
        HttpRequest {
            method: method.into(),
            path: path.into(),
            root_path: String::new(),
            route_prefix: "/".to_owned(),
            query: String::new(),
            headers: Vec::new(),
            body: Bytes::new(),
        }
    }

    /// The path after `root_path`: what the application routes on (may be "").
    pub fn route_path(&self) -> &str {
        self.path
            .strip_prefix(&self.root_path)
            .unwrap_or(&self.path)
    }

    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The request id (`x-request-id`).
    pub fn request_id(&self) -> &str {
        self.header(crate::REQUEST_ID_HEADER).unwrap_or_default()
    }

    /// The body as UTF-8 text.
    pub fn text(&self) -> Result<&str, std::str::Utf8Error> {
        std::str::from_utf8(&self.body)
    }

    /// The body parsed as JSON.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }
}

/// An HTTP response from an ingress.
///
/// Streaming (an ingress's [`Deployment::handle_stream`](flotilla::Deployment::handle_stream)):
/// the **first** item is the response head (its `status` and `headers`) and the
/// first body bytes (often empty); every **later** item adds its `body` as the
/// next chunk, and its status and headers are ignored (make them with
/// [`HttpResponse::chunk`]). The head is sent as soon as the first item comes,
/// each chunk as it comes (chunked transfer on HTTP/1.1, DATA frames on HTTP/2).
/// A response whose stream ends right after its first item is sent whole, with
/// `content-length`.
///
/// ```
/// use flotilla_http::HttpResponse;
/// let r = HttpResponse::text(200, "hello").with_header("x-served-by", "echo");
/// assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
/// let next = HttpResponse::chunk("more bytes");
/// assert_eq!(&next.body[..], b"more bytes");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpResponse {
    /// The status code.
    pub status: u16,
    /// Headers, in order (repeats allowed).
    pub headers: Vec<(String, String)>,
    /// The body (or this chunk of it).
    pub body: Bytes,
}

impl Default for HttpResponse {
    fn default() -> Self {
        HttpResponse {
            status: 200,
            headers: Vec::new(),
            body: Bytes::new(),
        }
    }
}

impl HttpResponse {
    /// A response with `status`, no headers and `body`.
    pub fn new(status: u16, body: impl Into<Bytes>) -> Self {
        HttpResponse {
            status,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// A `text/plain; charset=utf-8` response.
    pub fn text(status: u16, body: impl Into<String>) -> Self {
        HttpResponse::new(status, body.into())
            .with_header("content-type", "text/plain; charset=utf-8")
    }

    /// An `application/json` response of `value` (`null` if it cannot be
    /// encoded as JSON, which only a map with non-string keys does).
    pub fn json<T: Serialize>(status: u16, value: &T) -> Self {
        let body = serde_json::to_vec(value).unwrap_or_else(|_| b"null".to_vec());
        HttpResponse::new(status, body).with_header("content-type", "application/json")
    }

    /// A later item of a streamed response: only its body counts.
    pub fn chunk(body: impl Into<Bytes>) -> Self {
        HttpResponse {
            body: body.into(),
            ..HttpResponse::default()
        }
    }

    /// The same response with one more header. The proxy sets
    /// `content-length`, `transfer-encoding` and `x-request-id` itself and
    /// drops them here.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}
