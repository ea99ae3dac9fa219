//! The pool's connections: what every one of them starts with.

use crate::helpers::{self, TestDatabase};

async fn setting(url: &str, name: &str) -> String {
    setting_with(url, name, true).await
}

/// `name` on a connection of a pool with `database.generic_plans` as given.
async fn setting_with(url: &str, name: &str, generic_plans: bool) -> String {
    let client = helpers::pool_with(url, generic_plans).get().await.unwrap();
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
        setting(&db.url, "plan_cache_mode").await,
        "force_generic_plan"
    );
}

#[tokio::test]
async fn server_options_in_the_database_url_are_kept() {
    let db = TestDatabase::create().await;
    let separator = if db.url.contains('?') { '&' } else { '?' };
    let url = format!("{}{separator}options=-c%20statement_timeout%3D7s", db.url);
    assert_eq!(setting(&url, "statement_timeout").await, "7s");
    assert_eq!(setting(&url, "plan_cache_mode").await, "force_generic_plan");
}

#[tokio::test]
async fn without_generic_plans_the_server_plans_as_it_is_configured() {
    let db = TestDatabase::create().await;
    assert_eq!(
        setting_with(&db.url, "plan_cache_mode", false).await,
        "auto"
    );
}
