//! The invariants (docs/DESIGN.md, "What always holds"), checked at the end of tests
//! by the same checker as the chaos run (`test_support::invariants`), against
//! the test's database and the sandbox's ledger (the truth about charges).

use test_support::invariants;

use crate::helpers::{new_key, spawn_app, Seen, TestApp};

/// Panics with every violation found, each naming the rows involved.
pub async fn assert_invariants(app: &TestApp) {
    let db = app.db.client().await;
    let ledger = app.charges().await;
    let violations = invariants::violations(&db, &ledger).await;
    assert!(
        violations.is_empty(),
        "invariants violated:\n  {}",
        violations.join("\n  ")
    );
}

/// The checker finds an answered key whose stored answer disagrees with the
/// order its click made, though the key no longer links it: the order names
/// its click's key.
#[tokio::test]
async fn the_checker_finds_an_answer_that_disagrees_with_its_order() {
    let app = spawn_app().await;
    let seats = app.seed("show", 1, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    let key = new_key();
    let paid = Seen::of(app.post_order("alice", &key, &[hold], "pm_card_visa").await).await;
    assert_eq!(paid.status, 201);
    assert_invariants(&app).await;

    let db = app.db.client().await;
    db.execute(
        "UPDATE idempotency_keys SET response_status = 402 WHERE user_id = 'alice' AND key = $1",
        &[&key],
    )
    .await
    .unwrap();
    let violations = invariants::violations(&db, &app.charges().await).await;
    assert!(
        violations.len() == 1 && violations[0].contains(&format!("key alice/{key} stored 402")),
        "{violations:?}"
    );
}
