//! A real gRPC server on 127.0.0.1:0 with Assay's runtime (health, reflection, auth), for tests.

use std::net::SocketAddr;

use assay_rpc::{Readiness, ServeOptions};
use tokio::task::JoinHandle;
use tonic::service::Routes;
use tonic::transport::Channel;

/// A running server; stopped gracefully by [`TestServer::shutdown`] or aborted on drop.
pub struct TestServer {
    pub addr: SocketAddr,
    pub readiness: Readiness,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
}

impl TestServer {
    /// Serve `routes` (hosting `names`) on a free loopback port, SERVING at once.
    pub async fn start(routes: Routes, names: &[&'static str]) -> TestServer {
        Self::start_with(routes, names, ServeOptions::default(), true).await
    }

    /// Serve with options; `ready = false` leaves health NOT_SERVING.
    pub async fn start_with(routes: Routes, names: &[&'static str], options: ServeOptions, ready: bool) -> TestServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let readiness = Readiness::new(names).await;
        if ready {
            readiness.set_serving().await;
        }
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(assay_rpc::serve(listener, routes, readiness.clone(), options, async move {
            let _ = rx.await;
        }));
        TestServer { addr, readiness, stop: Some(tx), task: Some(task) }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A connected channel to the server.
    pub async fn channel(&self) -> Channel {
        Channel::from_shared(self.url()).expect("url").connect().await.expect("connect to test server")
    }

    /// Graceful stop; returns the server's result.
    pub async fn shutdown(mut self) -> Result<(), tonic::transport::Error> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        match self.task.take() {
            Some(t) => t.await.expect("server task"),
            None => Ok(()),
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}
