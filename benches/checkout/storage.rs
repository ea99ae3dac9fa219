//! Storage: what a key row costs on disk, and what deleting a day of
//! expired keys costs the clicks that arrive meanwhile.

use std::time::{Duration, Instant};

use serde_json::json;
use stagedoor_checkout::jobs::cleanup::{Cleanup, Swept};
use tokio_util::sync::CancellationToken;

use crate::load;
use crate::scenarios::{holds_for, orders_to};
use crate::servers::RunningApp;
use crate::{postgres, Bench};

/// Bytes per key row (table, TOAST and both indexes) with stored 201 bodies,
/// after a VACUUM (free space of dead versions stays in the files, as it
/// does in service).
pub async fn key_rows(bench: &mut Bench) {
    println!("\n== key rows: pg_total_relation_size('idempotency_keys') / rows");
    let client = postgres::connect(&bench.pg.bench_url()).await;
    client
        .batch_execute("VACUUM ANALYZE idempotency_keys")
        .await
        .expect("vacuum");
    let row = client
        .query_one(
            "SELECT count(*), avg(octet_length(response_body))::float8,
                    pg_total_relation_size('idempotency_keys'),
                    pg_relation_size('idempotency_keys'),
                    pg_indexes_size('idempotency_keys'),
                    avg(pg_column_size(k.*))::float8
             FROM idempotency_keys k WHERE response_status = 201",
            &[],
        )
        .await
        .expect("sizes");
    let (rows, body, total, heap, indexes, tuple): (i64, f64, i64, i64, i64, f64) = (
        row.get(0),
        row.get(1),
        row.get(2),
        row.get(3),
        row.get(4),
        row.get(5),
    );
    let all: i64 = client
        .query_one("SELECT count(*) FROM idempotency_keys", &[])
        .await
        .expect("count")
        .get(0);
    let columns = client
        .query_one(
            "SELECT avg(pg_column_size(user_id))::float8, avg(pg_column_size(key))::float8,
                    avg(pg_column_size(request_hash))::float8,
                    COALESCE(avg(pg_column_size(effect)), 0)::float8, -- answered keys keep no link
                    avg(pg_column_size(response_body))::float8,
                    avg(pg_column_size(response_content_type))::float8,
                    avg(pg_column_size(response_location))::float8
             FROM idempotency_keys WHERE response_status = 201",
            &[],
        )
        .await
        .expect("column sizes");
    let column = |i: usize| columns.get::<_, f64>(i).round();
    // An update that is not HOT (its page had no room for the new version)
    // leaves a new entry in both indexes and a hole in the heap.
    let updates = client
        .query_one(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
             WHERE relname = 'idempotency_keys'",
            &[],
        )
        .await
        .expect("update counts");
    let (updated, hot): (i64, i64) = (updates.get(0), updates.get(1));
    let per_row = total as f64 / all as f64;
    println!(
        "  {all} rows ({rows} with a 201): {per_row:.0} bytes a row (heap {:.0}, indexes {:.0}; tuple {tuple:.0}); body {body:.0} bytes",
        heap as f64 / all as f64,
        indexes as f64 / all as f64
    );
    println!("  updates: {updated}, of which HOT {hot}");
    // How full the indexes' leaf pages are, then the same indexes rebuilt:
    // what the run's history (page splits, entries of non-HOT updates that
    // VACUUM removed from pages it cannot give back) adds to a row.
    let leaves = index_leaves(&client).await;
    client
        .batch_execute("REINDEX TABLE idempotency_keys")
        .await
        .expect("reindex");
    let rebuilt: i64 = client
        .query_one("SELECT pg_indexes_size('idempotency_keys')", &[])
        .await
        .expect("index size")
        .get(0);
    let per_row_rebuilt = (total - indexes + rebuilt) as f64 / all as f64;
    println!(
        "  index leaf density {}; rebuilt: indexes {:.0} bytes a row, {per_row_rebuilt:.0} in all",
        leaves
            .iter()
            .map(|(name, density)| format!("{name} {density:.0} %"))
            .collect::<Vec<_>>()
            .join(", "),
        rebuilt as f64 / all as f64
    );
    bench.report.set("key_row_bytes", per_row);
    bench.report.set("key_body_bytes", body);
    bench.report.detail(
        "key_rows",
        json!({
            "rows": all, "rows_201": rows, "heap_bytes_per_row": heap as f64 / all as f64,
            "index_bytes_per_row": indexes as f64 / all as f64, "tuple_bytes": tuple,
            "updates": updated, "hot_updates": hot,
            "index_leaf_density_percent": leaves
                .iter()
                .map(|(name, density)| (name.clone(), json!(density)))
                .collect::<serde_json::Map<_, _>>(),
            "index_bytes_per_row_rebuilt": rebuilt as f64 / all as f64,
            "key_row_bytes_rebuilt": per_row_rebuilt,
            "column_bytes": {
                "user_id": column(0), "key": column(1), "request_hash": column(2),
                "effect": column(3), "response_body": column(4),
                "response_content_type": column(5), "response_location": column(6),
            },
        }),
    );
}

/// Each index of the key table and its leaf pages' average fill, in percent
/// (`pgstattuple`'s `pgstatindex`); empty where the extension is missing.
async fn index_leaves(client: &tokio_postgres::Client) -> Vec<(String, f64)> {
    if client
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        .await
        .is_err()
    {
        return Vec::new();
    }
    client
        .query(
            "SELECT i.indexrelid::regclass::text, (pgstatindex(i.indexrelid::regclass)).avg_leaf_density
             FROM pg_index i WHERE i.indrelid = 'idempotency_keys'::regclass ORDER BY 1",
            &[],
        )
        .await
        .map(|rows| {
            rows.iter()
                .map(|r| (r.get::<_, String>(0), r.get::<_, f64>(1)))
                .collect()
        })
        .unwrap_or_default()
}

/// Expired keys inserted by SQL, then deleted by `Cleanup::run` on the
/// instance's pool while first clicks arrive at a fixed rate (half of what
/// the instance can do): the clicks' p99 during the cleanup over their p99
/// just before it.
pub async fn cleanup(bench: &mut Bench, app: &RunningApp) {
    // The cluster carries a fifth of one PostgreSQL's clicks: with the quick
    // profile's keys its windows held 300-500 clicks, whose p99 is their
    // third to fifth slowest. A million keys, and a window before them as
    // long as their delete takes at about 100,000 rows/s, give each window
    // over a thousand.
    let (rows, before_secs) = if bench.pg.is_citus() {
        (
            bench.profile.cleanup_rows.max(1_000_000),
            bench.profile.measure.max(Duration::from_secs(10)),
        )
    } else {
        (bench.profile.cleanup_rows, bench.profile.measure)
    };
    println!("\n== cleanup: {rows} expired keys deleted while first clicks arrive");
    let body = bench
        .replay
        .as_ref()
        .map_or_else(|| b"{}".to_vec(), |s| s.body.clone());
    let client = postgres::connect(&bench.pg.bench_url()).await;
    let inserting = Instant::now();
    let mut done = 0;
    while done < rows {
        let chunk = (rows - done).min(250_000);
        client
            .execute(
                "INSERT INTO idempotency_keys (user_id, key, request_hash, claim_token,
                     lease_expires_at, response_status, response_body, response_content_type,
                     response_location, created_at)
                 SELECT 'old' || (g % 5000), 'key-' || g, sha256(g::text::bytea),
                        g, now() - interval '25 hours', 201, $1,
                        'application/json', '/orders/' || gen_random_uuid(),
                        now() - interval '25 hours' - g * interval '80 ms'
                 FROM generate_series($2::bigint, $3::bigint) g",
                &[&body, &(done + 1), &(done + chunk)],
            )
            .await
            .expect("expired keys");
        done += chunk;
    }
    client
        .batch_execute("VACUUM ANALYZE idempotency_keys")
        .await
        .expect("vacuum");
    // Keys a day old were last written long before the latest checkpoint,
    // so deleting them logs a full-page image of each page, as in service.
    // On the cluster the rows are the workers': each checkpoints, or its
    // own checkpoint comes due at some moment of the measured windows.
    client
        .batch_execute("CHECKPOINT")
        .await
        .expect("checkpoint");
    drop(client);
    for worker in bench.pg.worker_bench_urls() {
        postgres::connect(&worker)
            .await
            .batch_execute("CHECKPOINT")
            .await
            .expect("a worker's checkpoint");
    }
    println!(
        "  inserted, vacuumed and checkpointed in {:.1} s",
        inserting.elapsed().as_secs_f64()
    );

    // Half the measured rate, on the cluster too (a floor of 50/s there was
    // 86 % of what it carries, which leaves the cleanup no room).
    let rate = (bench.report.get("order_rps").unwrap_or(1_000.0) / 2.0).max(1.0);
    let max_during = Duration::from_secs(120);
    let holds = holds_for(bench, rate, (before_secs + max_during).as_secs_f64() + 5.0).await;
    let send = || {
        orders_to(
            format!("{}/orders", app.url),
            bench.buyers.clone(),
            holds.clone(),
            512,
        )
    };
    let never = CancellationToken::new();
    let before = load::open(rate, before_secs, before_secs, never, 512, send()).await;
    println!("  before, {rate:.0}/s: {}", before.summary());

    let stop = CancellationToken::new();
    let cleaner = Cleanup::new(app.pool.clone(), Duration::from_secs(86_400));
    let cleaning = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let outcome = cleaner.run().await;
            let elapsed = started.elapsed();
            stop.cancel();
            (outcome, elapsed)
        })
    };
    let during = load::open(rate, Duration::from_secs(1), max_during, stop, 512, send()).await;
    let (outcome, elapsed) = cleaning.await.expect("cleanup task");
    let deleted = match outcome {
        Ok(Swept::Deleted(n)) => n,
        other => panic!("cleanup did not run: {other:?}"),
    };
    println!("  during, {rate:.0}/s: {}", during.summary());
    let per_s = deleted as f64 / elapsed.as_secs_f64();
    println!(
        "  deleted {deleted} rows in {:.2} s: {per_s:.0} rows/s",
        elapsed.as_secs_f64()
    );
    bench.report.set("cleanup_rows", rows as f64);
    bench.report.set("cleanup_rows_per_s", per_s);
    bench
        .report
        .set("cleanup_order_p99_ms_before", before.p99_ms());
    bench
        .report
        .set("cleanup_order_p99_ms_during", during.p99_ms());
    bench
        .report
        .set("cleanup_order_p99_ratio", during.p99_ms() / before.p99_ms());
    if rows < 1_000_000 {
        bench
            .report
            .note(format!("cleanup ran on {rows} expired keys, not 1,000,000"));
    }
    bench.report.detail(
        "cleanup",
        json!({
            "rows": rows, "deleted": deleted, "secs": elapsed.as_secs_f64(),
            "order_rate": rate, "before_p50_ms": before.p50_ms(), "during_p50_ms": during.p50_ms(),
            "before_errors": before.errors(), "during_errors": during.errors(),
        }),
    );
}
