//! A background task whose owner ends it.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use tokio::task::{JoinError, JoinHandle};

/// A spawned task that is aborted when this is dropped (a tokio
/// `JoinHandle` dropped lets its task run on); awaited, it is the task's
/// result.
#[derive(Debug)]
pub struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> AbortOnDrop<T> {
    /// Own `task`.
    pub fn new(task: JoinHandle<T>) -> Self {
        AbortOnDrop(task)
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<T> Future for AbortOnDrop<T> {
    type Output = Result<T, JoinError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn awaited_it_is_the_tasks_result_and_dropped_it_aborts_the_task() {
        assert_eq!(
            AbortOnDrop::new(tokio::spawn(async { 7 })).await.unwrap(),
            7
        );
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = AbortOnDrop::new(tokio::spawn(async move {
            let _held = tx;
            std::future::pending::<()>().await;
        }));
        drop(task);
        // The task's end drops what it held.
        assert!(rx.await.is_err());
    }
}
