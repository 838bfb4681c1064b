//! `max_connection_age`: a server closes each connection gracefully once it is that old, so a
//! long-lived client channel reconnects (and, behind a Kubernetes Service, may land on another
//! pod) without failing a call, and a stream in flight is not cut. The client is a channel as the
//! stage clients hold it ([`ResendUnsent`]: a call handed to a closing connection just before the
//! GOAWAY arrived is sent again, on a new one).
//!
//! The client reaches the server through a counting TCP relay on loopback, which tells how many
//! connections the channel opened.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use assay_rpc::remote::ResendUnsent;
use assay_rpc::{Readiness, ServeOptions, serve};
use tokio::net::{TcpListener, TcpStream};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

/// Relay every connection accepted on a loopback port to `target`; returns the port's address
/// and the count of connections accepted.
async fn counting_relay(target: std::net::SocketAddr) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                if let Ok(mut outbound) = TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    (addr, accepted)
}

async fn start(age: Option<Duration>) -> (std::net::SocketAddr, Arc<AtomicUsize>, Readiness) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server_addr = listener.local_addr().unwrap();
    let readiness = Readiness::new(&["assay.test.v1.Test"]).await;
    readiness.set_serving().await;
    let options = ServeOptions { max_connection_age: age, ..ServeOptions::default() };
    let ready = readiness.clone();
    tokio::spawn(async move {
        serve(listener, tonic::service::Routes::default(), ready, options, std::future::pending()).await
    });
    let (relay, accepted) = counting_relay(server_addr).await;
    (relay, accepted, readiness)
}

async fn check(client: &mut HealthClient<ResendUnsent<tonic::transport::Channel>>) -> HealthCheckResponse {
    client.check(HealthCheckRequest { service: String::new() }).await.expect("every call succeeds").into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_connections_are_replaced_without_failing_a_call_or_cutting_a_stream() {
    let age = Duration::from_millis(300);
    let (addr, accepted, readiness) = start(Some(age)).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect_lazy();
    let mut client = HealthClient::new(ResendUnsent::new(channel));

    // A stream opened on the first connection, kept open across its age.
    let mut watch = client.watch(HealthCheckRequest { service: String::new() }).await.unwrap().into_inner();
    let first = watch.message().await.unwrap().expect("the current status");
    assert_eq!(first.status, ServingStatus::Serving as i32);

    // Unary calls spread over four connection ages, some of them racing a GOAWAY.
    for i in 0..120 {
        assert_eq!(check(&mut client).await.status, ServingStatus::Serving as i32);
        if i % 10 == 0 {
            tokio::time::sleep(age / 3).await;
        }
    }
    let connections = accepted.load(Ordering::SeqCst);
    assert!(connections >= 3, "the channel reconnected as connections aged out: {connections} connection(s)");

    // The stream from the first connection still delivers.
    readiness.set_not_serving().await;
    let next = tokio::time::timeout(Duration::from_secs(5), watch.message())
        .await
        .expect("the stream still delivers")
        .expect("no stream error")
        .expect("a message");
    assert_eq!(next.status, ServingStatus::NotServing as i32);
    eprintln!("max_connection_age {age:?}: 120 calls over {connections} connections, the first stream intact");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_age_one_connection_serves_every_call() {
    let (addr, accepted, _readiness) = start(None).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect_lazy();
    let mut client = HealthClient::new(ResendUnsent::new(channel));
    for _ in 0..6 {
        check(&mut client).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}
