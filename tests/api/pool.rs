//! The pool's connections: what every one of them starts with.

use secrecy::SecretString;
use stagedoor_checkout::config::DatabaseSettings;

use crate::helpers::TestDatabase;

async fn setting(url: String, name: &str) -> String {
    let pool = stagedoor_checkout::db::pool(&DatabaseSettings {
        url: SecretString::from(url),
        pool_size: 1,
        create_if_missing: false,
        pool_timeout_ms: 5_000,
    })
    .unwrap();
    let client = pool.get().await.unwrap();
    let row = client
        .query_one("SELECT current_setting($1)", &[&name])
        .await
        .unwrap();
    row.get(0)
}

#[tokio::test]
async fn pooled_connections_plan_each_statement_once() {
    let db = TestDatabase::create().await;
    assert_eq!(
        setting(db.url.clone(), "plan_cache_mode").await,
        "force_generic_plan"
    );
}

#[tokio::test]
async fn server_options_in_the_database_url_are_kept() {
    let db = TestDatabase::create().await;
    let separator = if db.url.contains('?') { '&' } else { '?' };
    let url = format!("{}{separator}options=-c%20statement_timeout%3D7s", db.url);
    assert_eq!(setting(url.clone(), "statement_timeout").await, "7s");
    assert_eq!(setting(url, "plan_cache_mode").await, "force_generic_plan");
}
