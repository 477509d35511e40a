//! Requests and responses inside one process: `call_owned` and
//! `call_stream_owned` hand a request of the deployment's own type to its
//! replica as the value itself, a replica's responses reach a caller that asks
//! for their type as values, and any other type is encoded and decoded as
//! before (so types may still differ on the two sides). A field that serde
//! skips tells a moved value from a decoded copy. Paused tokio time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use flotilla::{
    ApplicationSpec, BatchConfig, CallError, Deployment, DeploymentConfig, DeploymentSpec,
    Registry, UserError,
};
use futures::{Stream, StreamExt, stream};
use serde::{Deserialize, Serialize};

/// A message whose `mark` is never encoded: a decoded copy has 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Marked {
    text: String,
    #[serde(skip)]
    mark: u32,
}

/// The same fields as [`Marked`] without the mark: another type on the wire's
/// terms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Plain {
    text: String,
}

/// Answers with what it saw of the request's mark, and marks its answers 7.
struct Echo;

impl Deployment for Echo {
    type Request = Marked;
    type Response = Marked;
    // Batched through the default handle_batch by a test.
    const BATCHED: bool = true;

    async fn handle(&self, request: Marked) -> Result<Marked, UserError> {
        Ok(Marked {
            text: format!("{}:{}", request.text, request.mark),
            mark: 7,
        })
    }

    fn handle_stream(
        &self,
        request: Marked,
    ) -> impl Stream<Item = Result<Marked, UserError>> + Send + '_ {
        stream::iter((0..3).map(move |i| {
            Ok(Marked {
                text: format!("{}:{}:{i}", request.text, request.mark),
                mark: 7 + i,
            })
        }))
    }
}

/// The app and its handle, with its store's directory and its Serve.
type EchoApp = (
    tempfile::TempDir,
    flotilla::Serve,
    flotilla::DeploymentHandle,
);

async fn echo_app() -> EchoApp {
    echo_app_with(|c| c).await
}

/// The echo, its deployment's config changed by `config`.
async fn echo_app_with(config: impl FnOnce(DeploymentConfig) -> DeploymentConfig) -> EchoApp {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::new()
        .register("values::Echo", |_| async { Ok(Echo) })
        .unwrap();
    let serve = support::start_with(&dir, registry).await;
    let app = ApplicationSpec::builder("values")
        .deployment(DeploymentSpec::builder("echo", "values::Echo").with_config(config))
        .build()
        .unwrap();
    let handle = serve.run(app).await.unwrap();
    (dir, serve, handle)
}

fn marked(text: &str, mark: u32) -> Marked {
    Marked {
        text: text.to_owned(),
        mark,
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_by_value_of_the_deployments_type_reaches_it_as_the_value_itself() {
    let (_dir, _serve, h) = echo_app().await;
    let moved: Marked = h.call_owned(marked("a", 5)).await.unwrap();
    assert_eq!(
        moved,
        marked("a:5", 7),
        "the request and the response moved"
    );
    // By reference the request is encoded: the handler sees a decoded copy.
    let copied: Marked = h.call(&marked("b", 5)).await.unwrap();
    assert_eq!(copied, marked("b:0", 7));
}

#[tokio::test(start_paused = true)]
async fn values_of_another_type_than_the_deployments_are_encoded_on_the_way() {
    let (_dir, _serve, h) = echo_app().await;
    // A request of another type with the same fields decodes into the handler's.
    let answer: Marked = h.call_owned(Plain { text: "p".into() }).await.unwrap();
    assert_eq!(answer, marked("p:0", 7));
    // A response asked for as another type is encoded, then decoded: no mark.
    let plain: Plain = h.call_owned(marked("q", 2)).await.unwrap();
    assert_eq!(plain, Plain { text: "q:2".into() });
    // A request that does not decode as the handler's type is refused, by value too.
    let bad = h.call_owned::<_, Marked>(42u32).await.unwrap_err();
    assert!(matches!(bad, CallError::BadRequest(_)), "{bad}");
    let bad = h.call_owned::<_, u64>(marked("r", 1)).await.unwrap_err();
    assert!(matches!(bad, CallError::BadResponse(_)), "{bad}");
}

#[tokio::test(start_paused = true)]
async fn a_streams_items_reach_a_caller_of_their_type_as_values() {
    let (_dir, _serve, h) = echo_app().await;
    let moved: Vec<Marked> = h
        .call_stream_owned::<_, Marked>(marked("s", 4))
        .map(Result::unwrap)
        .collect()
        .await;
    assert_eq!(
        moved,
        vec![marked("s:4:0", 7), marked("s:4:1", 8), marked("s:4:2", 9)]
    );
    let copied: Vec<Plain> = h
        .call_stream::<_, Plain>(&marked("t", 4))
        .map(Result::unwrap)
        .collect()
        .await;
    let texts: Vec<&str> = copied.iter().map(|p| p.text.as_str()).collect();
    assert_eq!(texts, ["t:0:0", "t:0:1", "t:0:2"]);
}

/// Never encodes.
struct Unencodable;

impl Serialize for Unencodable {
    fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom("cannot be encoded"))
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_that_cannot_be_encoded_fails_at_once_and_runs_nothing() {
    let (_dir, _serve, h) = echo_app().await;
    let mut stream = h.call_stream::<_, Marked>(&Unencodable);
    let first = stream.next().await.unwrap().unwrap_err();
    assert!(
        matches!(&first, CallError::BadRequest(m) if m.contains("cannot be encoded")),
        "{first}"
    );
    assert!(
        stream.next().await.is_none(),
        "the error is the stream's only item"
    );
    // By value, as another type than the handler's: encoded when it is taken.
    let bad = h.call_owned::<_, Marked>(Unencodable).await.unwrap_err();
    assert!(matches!(bad, CallError::BadRequest(_)), "{bad}");
}

#[tokio::test(start_paused = true)]
async fn a_batched_deployment_gets_its_requests_encoded() {
    // Its batcher gathers bytes: by value or not, the handler sees a decoded
    // copy, and the caller the response's.
    let (_dir, _serve, h) =
        echo_app_with(|c| c.with_batching(BatchConfig::new(4, Duration::from_millis(1)))).await;
    let answer: Marked = h.call_owned(marked("b", 5)).await.unwrap();
    assert_eq!(answer, marked("b:0", 0));
}
