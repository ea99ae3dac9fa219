//! Resources an anonymous client can make the service keep.

use super::raw_status;
use crate::helpers::spawn_app;

#[tokio::test]
async fn made_up_http_methods_do_not_grow_the_metrics() {
    let app = spawn_app().await;
    // No token needed: any method on any path is counted.
    for i in 0..100 {
        let method = format!("X{i:03}{}", "A".repeat(1_000));
        let request = format!("{method} /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let status = raw_status(app.port, request.as_bytes()).await;
        assert!(
            status.is_some_and(|s| (400..500).contains(&s)),
            "{status:?}"
        );
    }
    let metrics = app.metrics().await;
    let series = metrics.lines().filter(|l| l.contains("method=\"X")).count();
    assert_eq!(series, 0, "{} bytes of metrics", metrics.len());
}
